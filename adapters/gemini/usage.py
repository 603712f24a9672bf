"""Gemini usageMetadata both ways: `promptTokenCount` counts cached tokens too; the cached part is
`cachedContentTokenCount` (implicit or explicit caches). Gemini reports no cache writes: other
protocols' writes stay inside `promptTokenCount`."""

from __future__ import annotations

from adapters.fields import token_count
from adapters.gemini.wire import UsageMetadata
from adapters.internal import NO_CACHE, CacheTokens, Usage
from adapters.json_types import JSONObject


def read_usage(u: JSONObject) -> Usage:
    cached = token_count(u.get("cachedContentTokenCount"))
    # Thinking tokens are billed as output.
    return Usage(token_count(u.get("promptTokenCount")),
                 token_count(u.get("candidatesTokenCount")) + token_count(u.get("thoughtsTokenCount")),
                 CacheTokens(read=cached) if cached else NO_CACHE)


def render_usage(u: Usage) -> UsageMetadata:
    out: UsageMetadata = {"promptTokenCount": u.input_tokens, "candidatesTokenCount": u.output_tokens,
                          "totalTokenCount": u.total_tokens}
    if u.cache.read:
        out["cachedContentTokenCount"] = u.cache.read
    return out


def web_searches(obj: JSONObject) -> int:
    """The Google Search queries grounding ran for an answer (or a streamed chunk): every candidate's
    `groundingMetadata.webSearchQueries`, as Google bills them."""
    candidates = obj.get("candidates")
    if type(candidates) is not list:
        return 0
    n = 0
    for c in candidates:
        meta = c.get("groundingMetadata") if type(c) is dict else None
        queries = meta.get("webSearchQueries") if type(meta) is dict else None
        if type(queries) is list:
            n += sum(1 for q in queries if type(q) is str)
    return n
