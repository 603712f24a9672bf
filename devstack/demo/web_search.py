"""A provider's own web search tool as the demo upstreams answer it, reported as each provider bills
it: Gemini's Google Search grounding (`groundingMetadata` with its one query, the prompt, on the
candidate or the streamed chunk that finishes it) and Anthropic's web_search server tool (its
`server_tool_use` and result blocks, and `usage.server_tool_use.web_search_requests`)."""

from __future__ import annotations

from typing import Any

import orjson

from devstack.demo.sse_rewrite import rewrite_events


def asked(native_only: str | None) -> bool:
    """The parsed request named Gemini's googleSearch or Anthropic's web_search tool (each adapter
    names its provider-only tools in `native_only`)."""
    return native_only is not None and (".googleSearch" in native_only or ".web_search_" in native_only)


def _grounding(query: str) -> dict[str, Any]:
    return {"webSearchQueries": [query[:200]],
            "groundingChunks": [{"web": {"uri": "https://example.com/demo-search", "title": "demo search"}}],
            "searchEntryPoint": {"renderedContent": "<div>demo search</div>"}}


def _searched(obj: dict[str, Any], query: str, *, whole: bool) -> dict[str, Any]:
    for c in obj.get("candidates") or ():  # Gemini: the candidate, or the chunk that finishes it
        if isinstance(c, dict) and (whole or c.get("finishReason")):
            c["groundingMetadata"] = _grounding(query)
    usage = obj.get("usage")
    if obj.get("type") in ("message", "message_delta") and isinstance(usage, dict):  # Anthropic
        usage["server_tool_use"] = {"web_search_requests": 1}
        if whole:
            obj["content"] = [
                {"type": "server_tool_use", "id": "srvtoolu_demo", "name": "web_search", "input": {"query": query[:200]}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_demo", "content": [
                    {"type": "web_search_result", "url": "https://example.com/demo-search", "title": "demo search",
                     "encrypted_content": "ZGVtbw==", "page_age": None}]},
                *obj.get("content", [])]
    return obj


def searched(body: bytes, query: str) -> bytes:
    """A whole answer that searched once."""
    return orjson.dumps(_searched(orjson.loads(body), query, whole=True))


def searched_events(data: bytes, query: str) -> bytes:
    """Streamed events (whole SSE events) of an answer that searched once: the search reported where
    the provider reports it."""
    return rewrite_events(data, lambda obj: [_searched(obj, query, whole=False)])
