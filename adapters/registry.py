"""Protocol lookup, client-route detection and whole-stream translation between two protocols."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote

from adapters import anthropic, azure_openai, bedrock, completions, gemini, openai, responses, vertex
from adapters.internal import ChatRequest, StreamEnd, StreamError, StreamEvent, StreamUntranslatable
from adapters.protocol import ChatProtocol, StreamDecoder, StreamEncoder
from adapters.reasoning import drop_reasoning
from adapters.stream_usage import StreamUsage

__all__ = ["PROTOCOLS", "CLIENT_AUTH_HEADERS", "ClientRoute", "StreamTranslator", "translate_stream",
           "detect_client_protocol"]

# `responses` (the OpenAI Responses API) is both a client and an upstream protocol (`protocol: responses`).
# The cloud protocols (azure-openai, ...) are upstream protocols only: no client path speaks them.
# `completions` (OpenAI's legacy /v1/completions) is a client protocol whose upstream is the
# deployment's own /v1/completions where it serves one, else the deployment's chat API.
PROTOCOLS: dict[str, ChatProtocol] = {"openai": openai, "anthropic": anthropic, "gemini": gemini,
                                      "responses": responses, "azure-openai": azure_openai, "bedrock": bedrock,
                                      "vertex": vertex, "completions": completions}
# Every protocol's client credential header (and any bearer token): none of them may reach an upstream.
CLIENT_AUTH_HEADERS: tuple[str, ...] = tuple(sorted({h for p in PROTOCOLS.values() for h in p.CLIENT_AUTH_HEADERS}
                                                    | {"authorization"}))


# The chat protocols a client may speak (keys of PROTOCOLS).
ChatProtocolName = Literal["openai", "anthropic", "gemini", "responses", "completions"]


@dataclass(frozen=True, slots=True)
class ClientRoute:
    protocol: ChatProtocolName
    model: str | None = None  # from the path (Gemini); the others carry it in the body
    stream: bool = False  # known from the path (Gemini :streamGenerateContent); else from the body


_GEMINI_PREFIXES = ("/v1beta/models/", "/v1/models/")
# The chat APIs at fixed paths (Gemini's carry the model in theirs): the Envoy config names them too
# (controlplane.bootstrap's duplex routes).
CHAT_PATHS: dict[str, ChatProtocolName] = {
    "/v1/chat/completions": "openai", "/chat/completions": "openai", "/v1/messages": "anthropic",
    "/v1/responses": "responses", "/responses": "responses", "/v1/completions": "completions",
    "/completions": "completions"}


def detect_client_protocol(method: str, path: str) -> ClientRoute | None:
    """Which client protocol a request speaks, from its method and path (query string ignored)."""
    if method.upper() != "POST":
        return None
    p = path.split("?", 1)[0]
    protocol = CHAT_PATHS.get(p)
    if protocol is not None:
        return ClientRoute(protocol)
    found = gemini_action(p)
    if found is not None:
        model, action = found
        if action == "generateContent":
            return ClientRoute("gemini", model, False)
        if action == "streamGenerateContent":
            return ClientRoute("gemini", model, True)
    return None


def gemini_action(path: str) -> tuple[str, str] | None:
    """(model, action) of a Gemini model call, `/v1beta/models/{model}:{action}` (or `/v1/`, google-genai's
    default), query string ignored."""
    p = path.split("?", 1)[0]
    for prefix in _GEMINI_PREFIXES:
        if p.startswith(prefix):
            model, sep, action = p[len(prefix):].rpartition(":")
            return (unquote(model), action) if sep and model and action else None
    return None


EventStage = Callable[[list[StreamEvent], bool], list[StreamEvent]]


class StreamTranslator:
    """Upstream SSE bytes in, client SSE bytes out; `meter` holds the usage seen so far."""

    __slots__ = ("_decoder", "_encoder", "_keep_reasoning", "_stage", "meter", "finished", "error", "untranslatable")

    def __init__(self, decoder: StreamDecoder, encoder: StreamEncoder, *, keep_reasoning: bool = True,
                 stage: EventStage | None = None) -> None:
        self._decoder = decoder
        self._encoder = encoder
        # Between decoder and encoder (guardrails' StreamGuard): events in, events out; True at the end.
        self._stage = stage
        self._keep_reasoning = keep_reasoning  # the deployment's `reasoning: show | drop`
        self.meter = StreamUsage()
        self.finished = False  # the upstream stream completed normally
        self.error: str | None = None  # message of an upstream error / cut, if any
        # The error is the answer's, not a failure: it holds what the client's protocol cannot express.
        self.untranslatable = False

    def _track(self, events: list[StreamEvent]) -> list[StreamEvent]:
        self.meter.observe(events)
        for ev in events:
            if isinstance(ev, StreamEnd):
                self.finished = True
            elif isinstance(ev, StreamError):
                self.error = ev.message
                self.untranslatable = isinstance(ev, StreamUntranslatable)
        return events if self._keep_reasoning else drop_reasoning(events)

    def feed(self, chunk: bytes) -> bytes:
        events = self._track(self._decoder.feed(chunk))
        return self._encoder.encode(events if self._stage is None else self._stage(events, False))

    def finish(self) -> bytes:
        events = self._track(self._decoder.close())
        return self._encoder.encode(events if self._stage is None else self._stage(events, True))

    # A caller that stages events itself, awaiting a check between decoding and encoding (a
    # guardrail that asks another service): decode (the end's events too), stage, then encode.
    def decode(self, chunk: bytes, end: bool) -> list[StreamEvent]:
        events = self._track(self._decoder.feed(chunk))
        return events + self._track(self._decoder.close()) if end else events

    def encode(self, events: list[StreamEvent]) -> bytes:
        return self._encoder.encode(events)


def translate_stream(upstream: str, client: str, request: ChatRequest, *,
                     keep_reasoning: bool = True, stage: EventStage | None = None) -> StreamTranslator:
    """A translator from the upstream protocol's stream to the client's, for this request;
    `keep_reasoning=False` (a deployment's `reasoning: drop`) leaves the reasoning out."""
    try:
        up, cl = PROTOCOLS[upstream], PROTOCOLS[client]
    except KeyError as e:
        raise ValueError(f"unknown protocol {e.args[0]!r}") from None
    return StreamTranslator(up.StreamDecoder(), cl.StreamEncoder(model=request.model, request=request),
                            keep_reasoning=keep_reasoning, stage=stage)
