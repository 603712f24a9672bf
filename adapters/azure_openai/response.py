"""Azure OpenAI answers: OpenAI's chat.completion plus content-filter annotations, and Azure's
error shape (`error.code`, `innererror.content_filter_result` when the filter refused)."""

from __future__ import annotations

import orjson

from adapters import openai
from adapters.internal import ChatRequest, ChatResponse
from adapters.upstream_errors import provider_message, sanitize
from contracts.errors import default_type

__all__ = ["parse_response", "render_response", "render_error", "parse_error", "filtered_categories"]

# A filtered answer arrives as finish_reason "content_filter", which openai.parse_response maps.
parse_response = openai.parse_response


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    """As Azure answers (the demo upstream's shape): OpenAI's, with empty filter annotations."""
    obj = orjson.loads(openai.render_response(resp, model=model, request=request))
    obj["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": {}}]
    for ch in obj["choices"]:
        ch["content_filter_results"] = {}
    return orjson.dumps(obj)


def filtered_categories(results: object) -> list[str]:
    """The categories a content_filter_result marks filtered, e.g. ["hate (high)"]."""
    if type(results) is not dict:
        return []
    out = []
    for name, r in results.items():
        if type(r) is dict and r.get("filtered") is True:
            sev = r.get("severity")
            out.append(f"{name} ({sev})" if type(sev) is str else str(name))
    return out


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    """Azure's error object: `code` carries what OpenAI's `type` does."""
    return orjson.dumps({"error": {"code": type or default_type(status), "message": message, "status": status}})


def parse_error(status: int, body: bytes) -> str:
    """The sanitized message; a content-filter refusal names the categories that tripped it."""
    base = provider_message(body) or f"upstream returned HTTP {status}"
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return base
    err = obj.get("error") if type(obj) is dict else None
    if type(err) is not dict or err.get("code") != "content_filter":
        return base
    inner = err.get("innererror")
    cats = filtered_categories(inner.get("content_filter_result") if type(inner) is dict else None)
    return sanitize(f"content filtered: {', '.join(cats)}" if cats else base) or base
