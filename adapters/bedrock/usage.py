"""Bedrock Converse usage both ways. As Anthropic counts, `inputTokens` excludes
`cacheReadInputTokens` and `cacheWriteInputTokens` and `totalTokens` adds all four; the hub's
`Usage.input_tokens` includes the cache, so reading adds, rendering subtracts. `cacheDetails` splits
the writes by TTL (1h before 5m), so 1-hour writes are priced as such."""

from __future__ import annotations

from adapters.bedrock.wire import CacheDetail, TokenUsage
from adapters.fields import token_count
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.json_types import JSONObject


def _writes_1h(details: object) -> int:
    if type(details) is not list:
        return 0
    return sum(token_count(d.get("inputTokens")) for d in details if type(d) is dict and d.get("ttl") == "1h")


def read_usage(u: JSONObject) -> Usage:
    read, write = token_count(u.get("cacheReadInputTokens")), token_count(u.get("cacheWriteInputTokens"))
    write_1h = min(write, _writes_1h(u.get("cacheDetails")))
    return Usage(token_count(u.get("inputTokens")) + read + write, token_count(u.get("outputTokens")),
                 CacheTokens(read, write, write_1h) if read or write else NO_CACHE)


def _details(c: CacheTokens) -> list[CacheDetail]:
    out: list[CacheDetail] = []
    if c.write_1h:
        out.append({"ttl": "1h", "inputTokens": c.write_1h})
    if c.write > c.write_1h:
        out.append({"ttl": "5m", "inputTokens": c.write - c.write_1h})
    return out


def render_usage(u: Usage) -> TokenUsage:
    c = u.cache
    out: TokenUsage = {"inputTokens": max(0, u.input_tokens - c.read - c.write), "outputTokens": u.output_tokens,
                       "totalTokens": u.total_tokens}
    if c:
        out["cacheReadInputTokens"] = c.read
        out["cacheWriteInputTokens"] = c.write
        if c.write:
            out["cacheDetails"] = _details(c)
    return out
