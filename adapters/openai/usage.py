"""Chat Completions usage both ways: `prompt_tokens` counts cached tokens too; the cached part is
`prompt_tokens_details.cached_tokens`. Cache writes have no field (OpenAI caches implicitly and
free): they stay inside `prompt_tokens`."""

from __future__ import annotations

from adapters.fields import token_count
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.json_types import JSONObject
from adapters.openai.wire import UsageOut


def cache_of(u: JSONObject) -> CacheTokens:
    details = u.get("prompt_tokens_details")
    cached = token_count(details.get("cached_tokens")) if type(details) is dict else 0
    return CacheTokens(read=cached) if cached else NO_CACHE


def read_usage(u: JSONObject) -> Usage:
    return Usage(token_count(u.get("prompt_tokens")), token_count(u.get("completion_tokens")), cache_of(u))


def render_usage(u: Usage) -> UsageOut:
    out: UsageOut = {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                     "total_tokens": u.total_tokens}
    if u.cache.read:
        out["prompt_tokens_details"] = {"cached_tokens": u.cache.read}
    return out
