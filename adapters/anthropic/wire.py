"""Anthropic Messages' wire vocabulary: stop reasons both ways, the structured-output tool, usage kinds."""

from __future__ import annotations

from adapters.internal import FinishReason

_FINISH_IN: dict[str, FinishReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
    "refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal",
    "error": "end_turn",
}
# Structured output to Anthropic is a forced tool of this name; its input comes back as the text.
JSON_TOOL = "modelyard_json_response"


_INPUT_KINDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
