"""What a translation means, read independently of the adapter that produced it: the canonical
form of a request, the meaning of a response or a stream, and the real SDKs' check of what a
client receives. Shared by the per-protocol tests and the golden pair cases (golden/)."""

from __future__ import annotations

import dataclasses

import anthropic as anthropic_sdk
import openai as openai_sdk
import orjson
import pydantic

from adapters import gemini
from adapters.internal import (
    ChatRequest,
    ChatResponse,
    StreamEnd,
    StreamEvent,
    StreamFinish,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)
from adapters.registry import PROTOCOLS
from adapters.sse import SSEFramer

NAMES = ["openai", "anthropic", "gemini"]
# Upstream protocols the golden pairs cover: the chat clients' protocols, and the Responses API.
UPSTREAMS = [*NAMES, "responses"]


def canon(req: ChatRequest) -> ChatRequest:
    """Drop what legitimately differs per protocol (tool-result names, usage/stream flags)."""
    # A Gemini rendering signs replayed calls with Google's stand-in thought signature.
    msgs = tuple(dataclasses.replace(m, name=None, is_error=False,
                                     tool_calls=tuple(dataclasses.replace(tc, signature=None) for tc in m.tool_calls))
                 for m in req.messages)
    return dataclasses.replace(req, messages=msgs, include_usage=False, stream=False, model="chat-model")


def parse(proto: str, raw: bytes, stream: bool = False) -> ChatRequest:
    if proto == "gemini":
        return gemini.parse_request(raw, path_model="chat-model", stream_hint=stream)
    return PROTOCOLS[proto].parse_request(raw, stream_hint=stream)


def meaning(resp: ChatResponse) -> tuple:
    calls = [(tc.name, orjson.loads(tc.arguments)) for tc in resp.tool_calls]
    return resp.content, calls, resp.finish_reason, resp.usage.input_tokens, resp.usage.output_tokens


def sdk_check(client: str, raw: bytes) -> None:
    """The real SDK types accept what we render (cheap shape check)."""
    obj = orjson.loads(raw)
    if client == "openai":
        openai_sdk.types.chat.ChatCompletion.model_validate(obj)
    elif client == "anthropic":
        anthropic_sdk.types.Message.model_validate(obj)
    else:
        assert set(obj) == {"candidates", "usageMetadata", "modelVersion", "responseId"}
        assert obj["candidates"][0]["content"]["role"] == "model"


def decode(proto: str, pieces: list[bytes]) -> list[StreamEvent]:
    d = PROTOCOLS[proto].StreamDecoder()
    out: list[StreamEvent] = []
    for p in pieces:
        out += d.feed(p)
    return out + d.close()


def summary(events: list[StreamEvent]) -> tuple:
    """(text, [(name, args)], finish, input, output, ended_cleanly) from a list of events."""
    text, names, args, finish, i, o = "", {}, {}, None, 0, 0
    for ev in events:
        if isinstance(ev, TextDelta):
            text += ev.text
        elif isinstance(ev, ToolCallStart):
            names[ev.index] = ev.name
            args.setdefault(ev.index, "")
        elif isinstance(ev, ToolCallDelta):
            args[ev.index] += ev.arguments
        elif isinstance(ev, StreamFinish):
            finish = ev.reason
        elif isinstance(ev, UsageUpdate):
            i = ev.input_tokens if ev.input_tokens is not None else i
            o = ev.output_tokens if ev.output_tokens is not None else o
    calls = [(names[k], orjson.loads(args[k])) for k in sorted(names)]
    return text, calls, finish, i, o, isinstance(events[-1], StreamEnd)


def client_events(client: str, raw: bytes) -> list[dict]:
    """Parse client SSE bytes with a plain framer (independent of our decoders) and SDK-validate them."""
    f = SSEFramer()
    evs = f.feed(raw) + f.close()
    out = []
    adapter = pydantic.TypeAdapter(anthropic_sdk.types.RawMessageStreamEvent)
    for ev in evs:
        if ev.data == b"[DONE]":
            out.append({"done": True})
            continue
        obj = orjson.loads(ev.data)
        if client == "openai" and "error" not in obj:
            openai_sdk.types.chat.ChatCompletionChunk.model_validate(obj)
        elif client == "anthropic" and obj.get("type") != "error":
            assert ev.event == obj["type"]
            adapter.validate_python(obj)
        out.append(obj)
    return out
