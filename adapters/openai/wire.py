"""OpenAI Chat Completions' wire vocabulary: finish reasons both ways, and the shapes of what we render."""

from __future__ import annotations

from typing import Literal, NotRequired, TypeAlias, TypedDict

from adapters.internal import FinishReason
from adapters.json_types import JSONObject

_FINISH_IN: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls",
    "content_filter": "content_filter", "error": "stop",
}


# ---- what we render (TypedDicts: plain dicts at run time, checked by mypy) -------------------


class FunctionCallOut(TypedDict):
    name: str
    arguments: str


class ToolCallOut(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCallOut


class FunctionDefOut(TypedDict):
    name: str
    description: NotRequired[str]
    parameters: JSONObject


class ToolOut(TypedDict):
    type: Literal["function"]
    function: FunctionDefOut


class TextContentOut(TypedDict):
    type: Literal["text"]
    text: str


class ImageURLOut(TypedDict):
    url: str


class ImageContentOut(TypedDict):
    type: Literal["image_url"]
    image_url: ImageURLOut


class FileDataOut(TypedDict):
    filename: str
    file_data: str


class FileContentOut(TypedDict):
    type: Literal["file"]
    file: FileDataOut


ContentPartOut: TypeAlias = "TextContentOut | ImageContentOut | FileContentOut"


class SystemMessageOut(TypedDict):
    role: Literal["system"]
    content: str


class UserMessageOut(TypedDict):
    role: Literal["user"]
    content: str | list[ContentPartOut]


class AssistantMessageOut(TypedDict):
    role: Literal["assistant"]
    content: str | None
    tool_calls: NotRequired[list[ToolCallOut]]


class ToolMessageOut(TypedDict):
    role: Literal["tool"]
    tool_call_id: str
    content: str


MessageOut: TypeAlias = "SystemMessageOut | UserMessageOut | AssistantMessageOut | ToolMessageOut"


class NamedFunction(TypedDict):
    name: str | None


class NamedToolChoice(TypedDict):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(TypedDict):
    name: str
    schema: JSONObject
    strict: NotRequired[bool]


class ResponseFormatOut(TypedDict):
    type: Literal["json_object", "json_schema"]
    json_schema: NotRequired[JSONSchemaFormat]


class StreamOptions(TypedDict):
    include_usage: bool


class ChatCompletionRequest(TypedDict):
    """The upstream request body, keys in the order they are rendered."""

    model: str
    messages: list[MessageOut]
    tools: NotRequired[list[ToolOut]]
    tool_choice: NotRequired[str | NamedToolChoice]
    parallel_tool_calls: NotRequired[bool]
    response_format: NotRequired[ResponseFormatOut]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    max_tokens: NotRequired[int]
    max_completion_tokens: NotRequired[int]
    stop: NotRequired[list[str]]
    seed: NotRequired[int]
    stream: NotRequired[bool]
    stream_options: NotRequired[StreamOptions]


class PromptTokensDetails(TypedDict):
    cached_tokens: int


class UsageOut(TypedDict):
    prompt_tokens: int  # cached tokens included
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: NotRequired[PromptTokensDetails]


class ResponseMessageOut(TypedDict):
    role: Literal["assistant"]
    content: str | None
    refusal: str | None
    reasoning_content: NotRequired[str]  # as vLLM, DeepSeek and SGLang answer (OpenAI's own hides it)
    tool_calls: NotRequired[list[ToolCallOut]]


class ChoiceOut(TypedDict):
    index: int
    message: ResponseMessageOut
    finish_reason: str
    logprobs: None


class ChatCompletion(TypedDict):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChoiceOut]
    usage: UsageOut


class ChunkFunction(TypedDict, total=False):
    name: str
    arguments: str


class ChunkToolCall(TypedDict):
    index: int
    id: NotRequired[str]
    type: NotRequired[Literal["function"]]
    function: ChunkFunction


class Delta(TypedDict, total=False):
    role: Literal["assistant"]
    content: str
    refusal: str
    reasoning_content: str
    tool_calls: list[ChunkToolCall]


class ChunkChoice(TypedDict):
    index: int
    delta: Delta
    finish_reason: str | None
    logprobs: None


class ChatCompletionChunk(TypedDict):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: NotRequired[UsageOut]


class ErrorDetail(TypedDict):
    message: str
    type: str
    param: None
    code: str | None


class ErrorBody(TypedDict):
    error: ErrorDetail
