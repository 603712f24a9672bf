"""Bedrock Converse wire shapes (the parts this gateway reads and writes), as AWS documents them.

Request: `POST /model/{modelId}/converse` (`/converse-stream` for ConverseStream). Everything is
camelCase JSON; a tool's input is a JSON object, and only inline bytes carry images and documents.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict


class ImageSource(TypedDict):
    bytes: str  # base64


class ImageBlock(TypedDict):
    format: Literal["png", "jpeg", "gif", "webp"]
    source: ImageSource


class DocumentBlock(TypedDict):
    format: str  # pdf, csv, doc, docx, xls, xlsx, html, txt, md
    name: str
    source: ImageSource


class ToolUseBlock(TypedDict):
    toolUseId: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(TypedDict):
    toolUseId: str
    content: list[dict[str, Any]]  # [{"text": ...}] or [{"json": ...}]
    status: NotRequired[Literal["success", "error"]]


class CachePointBlock(TypedDict):
    """A prompt-cache checkpoint: the prompt before it is cached (in system, messages' content
    and toolConfig.tools, at most 4 to a request)."""

    type: Literal["default"]
    ttl: NotRequired[Literal["5m", "1h"]]  # absent: the model's default (5 minutes)


class ContentBlock(TypedDict, total=False):
    text: str
    image: ImageBlock
    document: DocumentBlock
    toolUse: ToolUseBlock
    toolResult: ToolResultBlock
    cachePoint: CachePointBlock


class Message(TypedDict):
    role: Literal["user", "assistant"]
    content: list[ContentBlock]


class InferenceConfig(TypedDict, total=False):
    maxTokens: int
    temperature: float
    topP: float
    stopSequences: list[str]


class ToolSpec(TypedDict):
    name: str
    description: NotRequired[str]
    inputSchema: dict[str, Any]  # {"json": <JSON Schema>}


class ToolConfig(TypedDict):
    tools: list[dict[str, Any]]  # [{"toolSpec": ToolSpec}, {"cachePoint": ...}]
    toolChoice: NotRequired[dict[str, Any]]  # {"auto": {}} | {"any": {}} | {"tool": {"name": ...}}


class ConverseRequest(TypedDict, total=False):
    messages: list[Message]
    system: list[dict[str, Any]]  # [{"text": ...}, {"cachePoint": ...}]
    inferenceConfig: InferenceConfig
    toolConfig: ToolConfig
    additionalModelRequestFields: dict[str, Any]


class CacheDetail(TypedDict):
    ttl: Literal["5m", "1h"]
    inputTokens: int  # tokens written to the cache with this TTL


class TokenUsage(TypedDict, total=False):
    inputTokens: int  # cache reads and writes excluded, as Anthropic counts
    outputTokens: int
    totalTokens: int
    cacheReadInputTokens: int
    cacheWriteInputTokens: int
    cacheDetails: list[CacheDetail]  # the writes by TTL, 1h before 5m; absent or empty: no writes


StopReason = Literal["end_turn", "tool_use", "max_tokens", "stop_sequence", "guardrail_intervened",
                     "content_filtered", "model_context_window_exceeded"]


class ConverseResponse(TypedDict):
    output: dict[str, Any]  # {"message": Message}
    stopReason: StopReason
    usage: TokenUsage
    metrics: NotRequired[dict[str, Any]]


# ConverseStream event types (the `:event-type` header of each eventstream frame).
EVENT_TYPES = ("messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata")
