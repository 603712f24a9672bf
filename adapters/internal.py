"""The hub: one internal chat request/response/stream-event format every protocol converts through.

In the spirit of a unified inference request (model id, task type, inputs, parameters, stream flag,
task id), specialised for chat: `ChatRequest.messages` are the inputs, the sampling fields the
parameters. All types are frozen, slotted dataclasses; adapters build them once per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from adapters.cloud_targets import CloudTarget

from adapters.json_types import JSONObject

__all__ = [
    "Role", "FinishReason", "CacheTtl", "TextPart", "ImagePart", "DocumentPart", "ContentPart", "ToolCall", "ToolDef",
    "ToolChoice", "ResponseFormat", "RenderOptions", "Message", "ChatRequest", "CacheTokens", "NO_CACHE", "Usage", "ChatResponse", "UpstreamRequest",
    "ReasoningPart", "StreamStart", "TextDelta", "ReasoningDelta", "ToolCallStart", "ToolCallDelta", "StreamFinish", "UsageUpdate",
    "StreamEnd", "StreamError", "StreamUntranslatable", "StreamEvent", "estimate_prompt_tokens", "message_text",
]

Role = Literal["user", "assistant", "tool"]
# Internal finish reasons; every protocol maps its own vocabulary onto these.
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error"]
# A caller's prompt-cache marker on a block (Anthropic cache_control, Bedrock cachePoint): the
# prompt up to and including that block is to be cached for this long; None: no marker.
CacheTtl = Literal["5m", "1h"]


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str
    cache: CacheTtl | None = None


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image either inline (base64 `data` + `media_type`) or by `url`."""

    media_type: str | None = None
    data: str | None = None
    url: str | None = None
    cache: CacheTtl | None = None


@dataclass(frozen=True, slots=True)
class DocumentPart:
    """A non-image file (a PDF, plain text, ...) inline (base64 `data`) or by `url`; targets without
    a document part for its type refuse it (400) rather than pass it off as an image."""

    media_type: str
    data: str | None = None
    url: str | None = None
    name: str | None = None
    cache: CacheTtl | None = None


ContentPart = TextPart | ImagePart | DocumentPart


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI carries it; parsed only where a target needs an object
    # Gemini's opaque thoughtSignature for this call: Gemini 3 rejects a replayed call without it.
    signature: str | None = None


@dataclass(frozen=True, slots=True)
class ToolDef:
    name: str
    description: str | None = None
    parameters: JSONObject | None = None  # JSON Schema
    cache: CacheTtl | None = None


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None  # only for mode == "tool"


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Structured output: any JSON object, or one matching `schema` (JSON Schema)."""

    type: Literal["json_object", "json_schema"]
    schema: JSONObject | None = None
    name: str | None = None
    strict: bool | None = None


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """Per-deployment choices a target protocol's renderer needs (config, not the request)."""

    # Older OpenAI-compatible servers know only `max_tokens`; OpenAI's reasoning models reject it.
    legacy_max_tokens: bool = False
    # A cloud upstream's deployment facts and current credentials (adapters.cloud_targets).
    cloud: CloudTarget | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """One turn. Tool results are `role="tool"` messages carrying `tool_call_id` (and `name`)."""

    role: Role
    content: tuple[ContentPart, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None  # function name of a tool result (Gemini needs it)
    is_error: bool = False  # tool result reported as an error (Anthropic is_error)
    cache: CacheTtl | None = None  # a marker on the tool result as a whole (not on one of its parts)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    # The system prompt's blocks, kept only when one carries a cache marker (`system` is their text
    # joined): a renderer with markers keeps the blocks apart so each marker stays where it was.
    system_blocks: tuple[TextPart, ...] = ()
    tools: tuple[ToolDef, ...] = ()
    tool_choice: ToolChoice | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    top_k: int | None = None
    seed: int | None = None  # best-effort determinism (OpenAI `seed`, Gemini generationConfig.seed)
    parallel_tool_calls: bool | None = None  # False: at most one tool call per turn
    response_format: ResponseFormat | None = None
    stream: bool = False
    include_usage: bool = False  # client asked for a usage chunk (OpenAI stream_options)
    task: str = "chat"
    task_id: str | None = None
    # What only a deployment speaking the client's own protocol can take (Responses hosted tools,
    # reasoning options and items): such a request passes through there, and is a 400 elsewhere.
    native_only: str | None = None
    # Answers asked for (OpenAI's `n`): more than one only from a deployment speaking the client's
    # protocol (`native_only` says "n > 1"); the internal response carries the first.
    choices: int = 1


@dataclass(frozen=True, slots=True)
class CacheTokens:
    """The prompt-cache part of a call's input tokens, as the provider reported it."""

    read: int = 0  # prompt tokens served from the cache
    write: int = 0  # prompt tokens written to it, every TTL
    write_1h: int = 0  # of `write`: written with a 1-hour TTL (Anthropic), priced above 5-minute writes

    def __bool__(self) -> bool:
        return bool(self.read or self.write)


NO_CACHE = CacheTokens()


@dataclass(frozen=True, slots=True)
class Usage:
    # Every prompt token, cached ones included (OpenAI's prompt_tokens; Anthropic's input_tokens
    # plus its cache reads and writes).
    input_tokens: int = 0
    output_tokens: int = 0
    cache: CacheTokens = NO_CACHE
    # Web searches the provider ran and bills apart from tokens (Gemini's grounding queries, the
    # Responses API's web_search calls): priced by the model's `per_web_search` and `per_grounded_prompt`.
    web_searches: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class ReasoningPart:
    """One reasoning trace of an answer: an OpenAI reasoning summary, an Anthropic thinking block, a
    Gemini thought. `signature` is the upstream's opaque proof of it (Anthropic's signature, OpenAI's
    encrypted_content, Gemini's thoughtSignature); `redacted`: Anthropic redacted_thinking, whose
    encrypted data is the signature and which has no text."""

    text: str = ""
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class ChatResponse:
    id: str
    model: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: FinishReason = "stop"
    usage: Usage = field(default_factory=Usage)
    refusal: str | None = None  # the model declined (OpenAI message.refusal); content may be empty
    # What the answer holds that no other protocol can express (a hosted tool's output item): a
    # translated answer is then an error in the caller's shape; a same-protocol passthrough is not.
    untranslatable: str | None = None
    # The reasoning before the answer, in order (a deployment's `reasoning: drop` empties it).
    reasoning: tuple[ReasoningPart, ...] = ()


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    path: str
    headers: dict[str, str]
    body: bytes


# ---- stream events (what decoders emit and encoders consume) -------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    id: str
    model: str


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    refusal: bool = False  # OpenAI delta.refusal: text of a refusal, not of an answer


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """Reasoning text streaming (thinking, a summary, a thought); a delta with a `signature` ends
    its part, so the next reasoning text opens a new one. `redacted`: a whole Anthropic
    redacted_thinking block (no text, its data in `signature`)."""

    text: str = ""
    signature: str | None = None
    redacted: bool = False


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    index: int  # ordinal of the tool call within the response, 0-based
    id: str
    name: str
    signature: str | None = None  # Gemini thoughtSignature


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    arguments: str  # a fragment of the JSON arguments text


@dataclass(frozen=True, slots=True)
class StreamFinish:
    reason: FinishReason


@dataclass(frozen=True, slots=True)
class UsageUpdate:
    """Cumulative counts; None means 'not reported in this event' (cache: or none reported)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache: CacheTokens | None = None  # cumulative too: the cache part of input_tokens
    web_searches: int | None = None  # cumulative too (Usage.web_searches)


@dataclass(frozen=True, slots=True)
class StreamEnd:
    pass


@dataclass(frozen=True, slots=True)
class StreamError:
    message: str
    type: str = "api_error"


@dataclass(frozen=True, slots=True)
class StreamUntranslatable(StreamError):
    """The upstream streamed what no other protocol can express (a hosted tool's output item): the
    end of a translated stream, after the usage; a same-protocol passthrough passes it on as sent."""


StreamEvent = (StreamStart | TextDelta | ReasoningDelta | ToolCallStart | ToolCallDelta | StreamFinish | UsageUpdate | StreamEnd
               | StreamError)


def message_text(msg: Message) -> str:
    """The text parts of a message joined (images dropped)."""
    parts = [p.text for p in msg.content if type(p) is TextPart]
    return parts[0] if len(parts) == 1 else "".join(parts)


_IMAGE_TOKENS = 85  # flat per-image cost: a routing/rate-limit estimate, not billing


def estimate_prompt_tokens(req: ChatRequest) -> int:
    """Cheap prompt size estimate (chars/4 plus small per-message and per-image overheads)."""
    chars = len(req.system) if req.system else 0
    extra = 0
    for m in req.messages:
        extra += 4
        for p in m.content:
            if type(p) is TextPart:
                chars += len(p.text)
            else:
                extra += _IMAGE_TOKENS
        for tc in m.tool_calls:
            chars += len(tc.name) + len(tc.arguments)
    for t in req.tools:
        chars += len(t.name) + len(t.description or "") + (len(repr(t.parameters)) if t.parameters else 0)
    return chars // 4 + extra
