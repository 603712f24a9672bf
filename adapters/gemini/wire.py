"""Gemini's wire vocabulary: finish reasons both ways and the camelCase/snake_case field reader."""

from __future__ import annotations

from adapters.internal import FinishReason
from adapters.json_types import JSONObject

_FINISH_IN: dict[str, FinishReason] = {
    "STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter", "LANGUAGE": "content_filter", "MALFORMED_FUNCTION_CALL": "error",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY", "error": "OTHER",
}


def _get(obj: JSONObject, camel: str, snake: str) -> object:
    v = obj.get(camel)
    return obj.get(snake) if v is None else v
