"""Responses API usage both ways: `input_tokens` counts cached tokens too; the cached parts are
`input_tokens_details.cached_tokens` (reads) and `cache_write_tokens` (writes, any TTL)."""

from __future__ import annotations

from adapters.fields import token_count
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.responses.wire import UsageOut


def read_usage(raw: object, output: object = None) -> Usage:
    """`raw` the response's `usage`; `output` its items, whose web_search calls OpenAI bills per call."""
    searches = sum(1 for i in output if type(i) is dict and i.get("type") == "web_search_call") \
        if type(output) is list else 0
    if type(raw) is not dict:
        return Usage(web_searches=searches)
    details = raw.get("input_tokens_details")
    read = token_count(details.get("cached_tokens")) if type(details) is dict else 0
    write = token_count(details.get("cache_write_tokens")) if type(details) is dict else 0
    return Usage(token_count(raw.get("input_tokens")), token_count(raw.get("output_tokens")),
                 CacheTokens(read, write) if read or write else NO_CACHE, searches)


def render_usage(u: Usage) -> UsageOut:
    return {"input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cache.read, "cache_write_tokens": u.cache.write},
            "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}
