"""The Completions API's wire vocabulary: finish reasons both ways, and the shapes we render."""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

from adapters.internal import FinishReason
from adapters.openai.wire import StreamOptions, UsageOut

FINISH_IN: dict[str, FinishReason] = {"stop": "stop", "length": "length", "content_filter": "content_filter"}
# A completion has no tool calls; a translated chat answer that ends in one ended its text.
FINISH_OUT: dict[FinishReason, str] = {"stop": "stop", "length": "length", "tool_calls": "stop",
                                       "content_filter": "content_filter", "error": "stop"}


class CompletionRequest(TypedDict):
    """The upstream request body rendered from a one-turn ChatRequest, keys in rendering order."""

    model: str
    prompt: str
    max_tokens: NotRequired[int]
    temperature: NotRequired[float]
    top_p: NotRequired[float]
    top_k: NotRequired[int]
    stop: NotRequired[list[str]]
    seed: NotRequired[int]
    stream: NotRequired[bool]
    stream_options: NotRequired[StreamOptions]


class ChoiceOut(TypedDict):
    text: str
    index: int
    logprobs: None
    finish_reason: str | None


class TextCompletion(TypedDict):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[ChoiceOut]
    usage: NotRequired[UsageOut]
