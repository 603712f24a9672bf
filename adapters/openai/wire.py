"""OpenAI Chat Completions' wire vocabulary: finish reasons both ways."""

from __future__ import annotations

from adapters.internal import FinishReason

_FINISH_IN: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls",
    "content_filter": "content_filter", "error": "stop",
}
