"""Google Search grounding as Gemini answers it, for the demo Gemini upstream: a call with a
`googleSearch` tool gets `groundingMetadata` (its one query: the prompt) on its candidate, in a whole
body or on the streamed chunk that finishes it, as Gemini bills and reports a grounded answer."""

from __future__ import annotations

from typing import Any

import orjson


def asked(native_only: str | None) -> bool:
    """The parsed request named a googleSearch tool (adapters.gemini: a Gemini-only tool)."""
    return native_only is not None and ".googleSearch" in native_only


def _metadata(query: str) -> dict[str, Any]:
    return {"webSearchQueries": [query[:200]],
            "groundingChunks": [{"web": {"uri": "https://example.com/demo-search", "title": "demo search"}}],
            "searchEntryPoint": {"renderedContent": "<div>demo search</div>"}}


def _grounded(obj: dict[str, Any], query: str, *, finished_only: bool) -> dict[str, Any]:
    for c in obj.get("candidates") or ():
        if isinstance(c, dict) and (c.get("finishReason") or not finished_only):
            c["groundingMetadata"] = _metadata(query)
    return obj


def grounded(body: bytes, query: str) -> bytes:
    return orjson.dumps(_grounded(orjson.loads(body), query, finished_only=False))


def grounded_events(data: bytes, query: str) -> bytes:
    out = []
    for event in data.split(b"\n\n"):
        if event.startswith(b"data: {"):
            event = b"data: " + orjson.dumps(_grounded(orjson.loads(event[len(b"data: "):]), query, finished_only=True))
        if event:
            out.append(event + b"\n\n")
    return b"".join(out)
