"""Chat Completions SSE streams: the upstream decoder and the client encoder."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from adapters.call_ids import with_signature
from adapters.fields import error_message, token_count
from adapters.internal import (
    NO_CACHE,
    ChatRequest,
    ReasoningDelta,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    UsageUpdate,
)
from adapters.openai.errors import render_error
from adapters.openai.response import REASONING_FIELDS
from adapters.openai.usage import cache_of, render_usage
from adapters.openai.wire import _FINISH_IN, _FINISH_OUT, ChatCompletionChunk, Delta
from adapters.sse import SSEDecoder, SSEEvent, encode_event


def chunk_object(data: bytes, out: list[StreamEvent]) -> dict[str, Any] | None:
    """An OpenAI-style SSE chunk's object; None once `out` holds the end ([DONE]) or the error
    (a malformed chunk, an error object) it means, and the stream is over."""
    if data == b"[DONE]":
        out.append(StreamEnd())
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        obj = None
    if type(obj) is not dict:
        out.append(StreamError("upstream sent a malformed stream chunk", "api_error"))
        return None
    if "error" in obj:
        out.append(StreamError(error_message(data, 500), "api_error"))
        return None
    return obj


def stream_start(obj: dict[str, Any]) -> StreamStart:
    """The stream's start from its first chunk's id and model."""
    rid, model = obj.get("id"), obj.get("model")
    return StreamStart(rid if type(rid) is str else "", model if type(model) is str else "")


class StreamDecoder(SSEDecoder):
    """Upstream OpenAI SSE bytes -> internal stream events."""

    __slots__ = ("_started", "_tools", "_refused")

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        # Upstream tool index -> ordinal: some OpenAI-compatible servers number calls by content
        # block (text at 0, the first call at 1), and the OpenAI SDK indexes its list by it.
        self._tools: dict[int, int] = {}
        self._refused = False

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        obj = chunk_object(ev.data, out)
        if obj is None:
            self._done = True
            return
        if not self._started:
            self._started = True
            out.append(stream_start(obj))
        choices = obj.get("choices")
        if type(choices) is list and choices and type(choices[0]) is dict:
            ch = choices[0]
            delta = ch.get("delta")
            if type(delta) is dict:
                thought = next((t for k in REASONING_FIELDS if type(t := delta.get(k)) is str and t), None)
                if thought:
                    out.append(ReasoningDelta(thought))
                text = delta.get("content")
                if type(text) is str and text:
                    out.append(TextDelta(text))
                refusal = delta.get("refusal")
                if type(refusal) is str and refusal:
                    self._refused = True
                    out.append(TextDelta(refusal, refusal=True))
                tcs = delta.get("tool_calls")
                if type(tcs) is list:
                    for tc in tcs:
                        if type(tc) is not dict:
                            continue
                        idx = tc.get("index")
                        idx = idx if type(idx) is int else 0
                        fn = tc.get("function")
                        fn = fn if type(fn) is dict else {}
                        n = self._tools.get(idx)
                        if n is None:
                            n = self._tools[idx] = len(self._tools)
                            tid, name = tc.get("id"), fn.get("name")
                            out.append(ToolCallStart(n, tid if type(tid) is str else f"call_{n}",
                                                     name if type(name) is str else ""))
                        args = fn.get("arguments")
                        if type(args) is str and args:
                            out.append(ToolCallDelta(n, args))
            fr = ch.get("finish_reason")
            if type(fr) is str:
                reason = _FINISH_IN.get(fr, "stop")
                out.append(StreamFinish("content_filter" if self._refused and reason == "stop" else reason))
        usage = obj.get("usage")
        if type(usage) is dict:
            out.append(UsageUpdate(token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")),
                                   cache_of(usage) or None))

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before [DONE]", "api_error")


class StreamEncoder:
    """Internal stream events -> OpenAI chat.completion.chunk SSE bytes for the client."""

    __slots__ = ("_model", "_include_usage", "_id", "_created", "_started", "_done", "_in", "_out", "_cache", "_no_args",
                 "_thought")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._include_usage = bool(request and request.include_usage)
        self._id = ""
        self._created = int(time.time())
        self._started = False
        self._done = False
        self._in = 0
        self._out = 0
        self._cache = NO_CACHE
        self._no_args: set[int] = set()  # tool calls that have streamed no argument text yet
        self._thought = ""  # reasoning so far: "" none, "open" a part streaming, "ended" (next: a new paragraph)

    def _chunk(self, delta: Delta, finish: str | None = None) -> bytes:
        chunk: ChatCompletionChunk = {
            "id": self._id, "object": "chat.completion.chunk", "created": self._created, "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return encode_event(orjson.dumps(chunk))

    def _start(self, rid: str, parts: list[bytes]) -> None:
        self._started = True
        self._id = rid or "chatcmpl-" + uuid.uuid4().hex
        parts.append(self._chunk({"role": "assistant", "content": ""}))

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, StreamStart):
                if not self._started:
                    self._start(ev.id, parts)
                continue
            if isinstance(ev, UsageUpdate):
                if ev.input_tokens is not None:
                    self._in = ev.input_tokens
                if ev.output_tokens is not None:
                    self._out = ev.output_tokens
                if ev.cache is not None:
                    self._cache = ev.cache
                continue
            if isinstance(ev, StreamError):
                self._done = True
                parts.append(encode_event(render_error(500, ev.message, ev.type)))
                continue
            if not self._started:
                self._start("", parts)
            if isinstance(ev, ReasoningDelta):
                # Chat has only the text: signatures and redacted reasoning cannot be carried, and may be left out.
                if ev.text and not ev.redacted:
                    text = "\n\n" + ev.text if self._thought == "ended" else ev.text
                    self._thought = "open"
                    parts.append(self._chunk({"reasoning_content": text}))
                if ev.signature is not None and self._thought:
                    self._thought = "ended"
            elif isinstance(ev, TextDelta):
                parts.append(self._chunk({"refusal": ev.text} if ev.refusal else {"content": ev.text}))
            elif isinstance(ev, ToolCallStart):
                self._no_args.add(ev.index)
                parts.append(self._chunk({"tool_calls": [{
                    "index": ev.index, "id": with_signature(ev.id, ev.signature), "type": "function",
                    "function": {"name": ev.name, "arguments": ""},
                }]}))
            elif isinstance(ev, ToolCallDelta):
                self._no_args.discard(ev.index)
                parts.append(self._chunk({"tool_calls": [{"index": ev.index, "function": {"arguments": ev.arguments}}]}))
            elif isinstance(ev, StreamFinish):
                self._close_empty_calls(parts)
                parts.append(self._chunk({}, _FINISH_OUT[ev.reason]))
            elif isinstance(ev, StreamEnd):
                self._close_empty_calls(parts)
                self._done = True
                if self._include_usage:
                    usage: ChatCompletionChunk = {
                        "id": self._id, "object": "chat.completion.chunk", "created": self._created,
                        "model": self._model, "choices": [],
                        "usage": render_usage(Usage(self._in, self._out, self._cache)),
                    }
                    parts.append(encode_event(orjson.dumps(usage)))
                parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)

    def _close_empty_calls(self, parts: list[bytes]) -> None:
        # A call without arguments ends as "{}" (JSON), as a non-streamed answer gives it.
        for index in sorted(self._no_args):
            parts.append(self._chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]}))
        self._no_args.clear()
