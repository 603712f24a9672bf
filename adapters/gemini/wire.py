"""Gemini's wire vocabulary: finish reasons both ways, the camelCase/snake_case field reader, and the
shapes of what we render."""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

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


# ---- what we render (TypedDicts: plain dicts at run time, checked by mypy) -------------------


class Blob(TypedDict):
    mimeType: str | None
    data: str | None


class FileData(TypedDict):
    mimeType: str | None
    fileUri: str


class TextPartOut(TypedDict):
    text: str


class ThoughtPart(TypedDict):
    text: str
    thought: Literal[True]
    thoughtSignature: NotRequired[str]


class InlineDataPart(TypedDict):
    inlineData: Blob


class FileDataPart(TypedDict):
    fileData: FileData


class FunctionCallOut(TypedDict):
    name: str
    args: JSONObject


class FunctionCallPart(TypedDict):
    functionCall: FunctionCallOut
    thoughtSignature: NotRequired[str]


class FunctionResponseOut(TypedDict):
    name: str
    response: JSONObject


class FunctionResponsePart(TypedDict):
    functionResponse: FunctionResponseOut


MediaPart: TypeAlias = "InlineDataPart | FileDataPart"
PartOut: TypeAlias = "TextPartOut | ThoughtPart | InlineDataPart | FileDataPart | FunctionCallPart | FunctionResponsePart"


class ContentOut(TypedDict):
    role: Literal["user", "model"]
    parts: list[PartOut]


class SystemInstruction(TypedDict):
    parts: list[TextPartOut]


class FunctionDeclaration(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: NotRequired[JSONObject]


class ToolOut(TypedDict):
    functionDeclarations: list[FunctionDeclaration]


class FunctionCallingConfig(TypedDict):
    mode: Literal["AUTO", "NONE", "ANY"]
    allowedFunctionNames: NotRequired[list[str | None]]


class ToolConfig(TypedDict):
    functionCallingConfig: FunctionCallingConfig


class GenerationConfig(TypedDict, total=False):
    temperature: float
    topP: float
    topK: int
    seed: int
    maxOutputTokens: int
    stopSequences: list[str]
    responseMimeType: str
    responseSchema: JSONObject


class GenerateContentRequest(TypedDict):
    """The upstream request body, keys in the order they are rendered."""

    contents: list[ContentOut]
    systemInstruction: NotRequired[SystemInstruction]
    tools: NotRequired[list[ToolOut]]
    toolConfig: NotRequired[ToolConfig]
    generationConfig: NotRequired[GenerationConfig]


class UsageMetadata(TypedDict):
    promptTokenCount: int  # cached tokens included
    candidatesTokenCount: int
    totalTokenCount: int
    cachedContentTokenCount: NotRequired[int]


class CandidateOut(TypedDict):
    content: ContentOut
    finishReason: NotRequired[str]
    index: int


class GenerateContentResponse(TypedDict):
    """A whole answer, and each `data:` chunk of a stream (usage only on the last)."""

    candidates: list[CandidateOut]
    usageMetadata: NotRequired[UsageMetadata]
    modelVersion: str
    responseId: str


class ErrorStatus(TypedDict):
    code: int
    message: str
    status: str


class ErrorBody(TypedDict):
    error: ErrorStatus
