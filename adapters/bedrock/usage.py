"""Bedrock Converse usage both ways. As Anthropic counts, `inputTokens` excludes
`cacheReadInputTokens` and `cacheWriteInputTokens` and `totalTokens` adds all four; the hub's
`Usage.input_tokens` includes the cache, so reading adds, rendering subtracts."""

from __future__ import annotations

from adapters.bedrock.wire import TokenUsage
from adapters.fields import token_count
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.json_types import JSONObject


def read_usage(u: JSONObject) -> Usage:
    read, write = token_count(u.get("cacheReadInputTokens")), token_count(u.get("cacheWriteInputTokens"))
    return Usage(token_count(u.get("inputTokens")) + read + write, token_count(u.get("outputTokens")),
                 CacheTokens(read, write) if read or write else NO_CACHE)


def render_usage(u: Usage) -> TokenUsage:
    c = u.cache
    out: TokenUsage = {"inputTokens": max(0, u.input_tokens - c.read - c.write), "outputTokens": u.output_tokens,
                       "totalTokens": u.total_tokens}
    if c:
        out["cacheReadInputTokens"] = c.read
        out["cacheWriteInputTokens"] = c.write
    return out
