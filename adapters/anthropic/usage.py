"""Anthropic Messages usage both ways. Anthropic's `input_tokens` excludes cache reads and writes
(`cache_read_input_tokens`, `cache_creation_input_tokens`, the latter split by TTL in
`cache_creation`); the hub's `Usage.input_tokens` includes them, so reading adds, rendering subtracts."""

from __future__ import annotations

from adapters.anthropic.wire import UsageOut
from adapters.fields import token_count
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.json_types import JSONObject

READ, WRITE = "cache_read_input_tokens", "cache_creation_input_tokens"


def one_hour_writes(u: JSONObject) -> int:
    split = u.get("cache_creation")
    return token_count(split.get("ephemeral_1h_input_tokens")) if type(split) is dict else 0


def cache_of(read: int, write: int, write_1h: int) -> CacheTokens:
    return CacheTokens(read, write, min(write_1h, write)) if read or write else NO_CACHE


def web_searches(u: JSONObject) -> int:
    """The web searches a server tool ran (`server_tool_use.web_search_requests`), billed per search."""
    server = u.get("server_tool_use")
    return token_count(server.get("web_search_requests")) if type(server) is dict else 0


def read_usage(u: JSONObject) -> Usage:
    read, write = token_count(u.get(READ)), token_count(u.get(WRITE))
    return Usage(token_count(u.get("input_tokens")) + read + write, token_count(u.get("output_tokens")),
                 cache_of(read, write, one_hour_writes(u)), web_searches(u))


def render_usage(u: Usage) -> UsageOut:
    c = u.cache
    out: UsageOut = {"input_tokens": max(0, u.input_tokens - c.read - c.write), "output_tokens": u.output_tokens}
    if c:
        out["cache_creation_input_tokens"] = c.write
        out["cache_read_input_tokens"] = c.read
        out["cache_creation"] = {"ephemeral_5m_input_tokens": c.write - c.write_1h,
                                 "ephemeral_1h_input_tokens": c.write_1h}
    return out
