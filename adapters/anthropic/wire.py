"""Anthropic Messages' wire vocabulary: stop reasons both ways, the structured-output tool, usage
kinds, and the shapes of what we render."""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from adapters.internal import FinishReason
from adapters.json_types import JSONObject

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


# ---- what we render (TypedDicts: plain dicts at run time, checked by mypy) -------------------


class URLSource(TypedDict):
    type: Literal["url"]
    url: str


class Base64Source(TypedDict):
    type: Literal["base64"]
    media_type: str
    data: str | None


class TextSource(TypedDict):
    type: Literal["text"]
    media_type: Literal["text/plain"]
    data: str


class CacheControl(TypedDict):
    type: Literal["ephemeral"]
    ttl: NotRequired[Literal["1h"]]  # absent: 5 minutes


class TextBlock(TypedDict):
    type: Literal["text"]
    text: str
    cache_control: NotRequired[CacheControl]


class ImageBlock(TypedDict):
    type: Literal["image"]
    source: URLSource | Base64Source
    cache_control: NotRequired[CacheControl]


class DocumentBlock(TypedDict):
    type: Literal["document"]
    source: URLSource | TextSource | Base64Source
    title: NotRequired[str]
    cache_control: NotRequired[CacheControl]


UserBlock: TypeAlias = "TextBlock | ImageBlock | DocumentBlock"


class ToolUseBlock(TypedDict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: JSONObject


class ThinkingBlock(TypedDict):
    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(TypedDict):
    type: Literal["redacted_thinking"]
    data: str


AnswerBlock: TypeAlias = "ThinkingBlock | RedactedThinkingBlock | TextBlock | ToolUseBlock"


class ToolResultBlock(TypedDict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Block]
    is_error: NotRequired[bool]
    cache_control: NotRequired[CacheControl]


Block: TypeAlias = "TextBlock | ImageBlock | DocumentBlock | ToolUseBlock | ToolResultBlock"


class MessageOut(TypedDict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolDefOut(TypedDict):
    name: str
    description: NotRequired[str]
    input_schema: JSONObject
    cache_control: NotRequired[CacheControl]


class ToolChoiceOut(TypedDict):
    type: Literal["auto", "any", "tool", "none"]
    name: NotRequired[str | None]
    disable_parallel_tool_use: NotRequired[bool]


class MessagesRequest(TypedDict):
    """The upstream request body, keys in the order they are rendered."""

    model: str
    max_tokens: int
    messages: list[MessageOut]
    system: NotRequired[str | list[TextBlock]]  # blocks only when one carries a cache marker
    tools: NotRequired[list[ToolDefOut]]
    tool_choice: NotRequired[ToolChoiceOut]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    top_k: NotRequired[int]
    stop_sequences: NotRequired[list[str]]
    stream: NotRequired[bool]


class CacheCreationOut(TypedDict):
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class UsageOut(TypedDict):
    input_tokens: int  # cache reads and writes excluded
    output_tokens: int
    cache_creation_input_tokens: NotRequired[int]
    cache_read_input_tokens: NotRequired[int]
    cache_creation: NotRequired[CacheCreationOut]


class MessageResponse(TypedDict):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[AnswerBlock]
    stop_reason: str | None
    stop_sequence: None
    usage: UsageOut


class ErrorDetail(TypedDict):
    type: str
    message: str


class ErrorBody(TypedDict):
    type: Literal["error"]
    error: ErrorDetail


# ---- stream events (each SSE event is named after its payload's `type`) ---------------------


class MessageStart(TypedDict):
    type: Literal["message_start"]
    message: MessageResponse


class ContentBlockStart(TypedDict):
    type: Literal["content_block_start"]
    index: int
    content_block: AnswerBlock


class TextDeltaOut(TypedDict):
    type: Literal["text_delta"]
    text: str


class InputJSONDelta(TypedDict):
    type: Literal["input_json_delta"]
    partial_json: str


class ThinkingDeltaOut(TypedDict):
    type: Literal["thinking_delta"]
    thinking: str


class SignatureDeltaOut(TypedDict):
    type: Literal["signature_delta"]
    signature: str


class ContentBlockDelta(TypedDict):
    type: Literal["content_block_delta"]
    index: int
    delta: TextDeltaOut | InputJSONDelta | ThinkingDeltaOut | SignatureDeltaOut


class ContentBlockStop(TypedDict):
    type: Literal["content_block_stop"]
    index: int


class StopDelta(TypedDict):
    stop_reason: str
    stop_sequence: None


class MessageDelta(TypedDict):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: UsageOut


class MessageStop(TypedDict):
    type: Literal["message_stop"]


StreamEventOut: TypeAlias = (
    "MessageStart | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop | ErrorBody"
)
