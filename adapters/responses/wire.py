"""The shapes of what the Responses API adapter renders: upstream request bodies, `response`
objects and their output items (TypedDicts: plain dicts at run time, checked by mypy)."""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypeAlias, TypedDict

from adapters.json_types import JSONObject

# ---- the request we send upstream -------------------------------------------------------------


class InputText(TypedDict):
    type: Literal["input_text", "output_text"]
    text: str


class InputImage(TypedDict):
    type: Literal["input_image"]
    image_url: str


class InputFile(TypedDict):
    type: Literal["input_file"]
    file_data: NotRequired[str]
    file_url: NotRequired[str | None]
    filename: NotRequired[str]


InputPart: TypeAlias = "InputText | InputImage | InputFile"


class MessageItem(TypedDict):
    type: Literal["message"]
    role: Literal["user", "assistant"]
    content: list[InputPart]


class FunctionCallItem(TypedDict):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(TypedDict):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[InputPart]  # parts when the result holds images or files


InputItem: TypeAlias = "MessageItem | FunctionCallItem | FunctionCallOutputItem"


class FunctionTool(TypedDict):
    type: Literal["function"]
    name: str
    parameters: JSONObject
    description: NotRequired[str]


class NamedFunctionChoice(TypedDict):
    type: Literal["function"]
    name: str | None


class TextFormat(TypedDict):
    type: Literal["text", "json_object", "json_schema"]
    name: NotRequired[str]
    schema: NotRequired[JSONObject]
    strict: NotRequired[bool]


class TextConfig(TypedDict):
    format: TextFormat


class ResponsesRequest(TypedDict):
    """The upstream request body, keys in the order they are rendered."""

    model: str
    input: list[InputItem]
    store: bool
    instructions: NotRequired[str]
    tools: NotRequired[list[FunctionTool]]
    tool_choice: NotRequired[str | NamedFunctionChoice]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    max_output_tokens: NotRequired[int]
    parallel_tool_calls: NotRequired[bool]
    text: NotRequired[TextConfig]
    stream: NotRequired[bool]


# ---- the `response` object we answer with (whole, and in the stream's lifecycle events) -------


class InputTokensDetails(TypedDict):
    cached_tokens: int
    cache_write_tokens: int


class OutputTokensDetails(TypedDict):
    reasoning_tokens: int


class UsageOut(TypedDict):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class OutputText(TypedDict):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class RefusalPart(TypedDict):
    type: Literal["refusal"]
    refusal: str


OutputPart: TypeAlias = "OutputText | RefusalPart"


class OutputMessage(TypedDict):
    type: Literal["message"]
    id: str
    status: str
    role: Literal["assistant"]
    content: list[OutputPart]


class OutputCall(TypedDict):
    type: Literal["function_call"]
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class SummaryText(TypedDict):
    type: Literal["summary_text"]
    text: str


class OutputReasoning(TypedDict):
    type: Literal["reasoning"]
    id: str
    summary: list[SummaryText]
    encrypted_content: NotRequired[str]  # the opaque state a later turn hands back


OutputItem: TypeAlias = "OutputMessage | OutputCall | OutputReasoning"


class ResponseError(TypedDict):
    code: str
    message: str


class IncompleteDetails(TypedDict):
    reason: str


class Reasoning(TypedDict):
    effort: None
    summary: None


class ResponseObject(TypedDict):
    id: str
    object: Literal["response"]
    created_at: int
    status: str
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    previous_response_id: None
    parallel_tool_calls: bool
    reasoning: Reasoning
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: str | NamedFunctionChoice
    tools: list[FunctionTool]
    top_p: float | None
    truncation: Literal["disabled"]
    usage: UsageOut | None
    user: None
    metadata: JSONObject
