"""Completions SSE streams (`text_completion` chunks): the upstream decoder and the client encoder."""

from __future__ import annotations

import time
import uuid

import orjson

from adapters.completions.wire import FINISH_IN, FINISH_OUT, ChoiceOut, TextCompletion
from adapters.fields import token_count
from adapters.internal import (
    NO_CACHE,
    ChatRequest,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    Usage,
    UsageUpdate,
)
from adapters.openai.errors import render_error
from adapters.openai.stream import chunk_object, stream_start
from adapters.openai.usage import cache_of, render_usage
from adapters.sse import SSEDecoder, SSEEvent, encode_event


class StreamDecoder(SSEDecoder):
    """Upstream `text_completion` SSE bytes -> internal stream events (the first choice's text)."""

    __slots__ = ("_started",)

    def __init__(self) -> None:
        super().__init__()
        self._started = False

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        obj = chunk_object(ev.data, out)
        if obj is None:
            self._done = True
            return
        if not self._started:
            self._started = True
            out.append(stream_start(obj))
        choices = obj.get("choices")
        if type(choices) is list:
            for ch in choices:  # several prompts or n > 1: choice 0 is the answer's text, every token counts
                if type(ch) is not dict or ch.get("index", 0) != 0:
                    continue
                text = ch.get("text")
                if type(text) is str and text:
                    out.append(TextDelta(text))
                fr = ch.get("finish_reason")
                if type(fr) is str:
                    out.append(StreamFinish(FINISH_IN.get(fr, "stop")))
        usage = obj.get("usage")
        if type(usage) is dict:
            out.append(UsageUpdate(token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")),
                                   cache_of(usage) or None))

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before [DONE]", "api_error")


class StreamEncoder:
    """Internal stream events -> `text_completion` SSE chunks for the client (reasoning and tool
    calls have no place in a completion: left out)."""

    __slots__ = ("_model", "_include_usage", "_id", "_created", "_done", "_in", "_out", "_cache")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._include_usage = bool(request and request.include_usage)
        self._id = ""
        self._created = int(time.time())
        self._done = False
        self._in = 0
        self._out = 0
        self._cache = NO_CACHE

    def _chunk(self, choices: list[ChoiceOut], usage: Usage | None = None) -> bytes:
        if not self._id:
            self._id = "cmpl-" + uuid.uuid4().hex
        chunk: TextCompletion = {"id": self._id, "object": "text_completion", "created": self._created,
                                 "model": self._model, "choices": choices}
        if usage is not None:
            chunk["usage"] = render_usage(usage)
        return encode_event(orjson.dumps(chunk))

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, StreamStart):
                self._id = self._id or ev.id
            elif isinstance(ev, UsageUpdate):
                self._in = self._in if ev.input_tokens is None else ev.input_tokens
                self._out = self._out if ev.output_tokens is None else ev.output_tokens
                self._cache = self._cache if ev.cache is None else ev.cache
            elif isinstance(ev, StreamError):
                self._done = True
                parts.append(encode_event(render_error(500, ev.message, ev.type)))
            elif isinstance(ev, TextDelta):
                parts.append(self._chunk([{"text": ev.text, "index": 0, "logprobs": None, "finish_reason": None}]))
            elif isinstance(ev, StreamFinish):
                parts.append(self._chunk([{"text": "", "index": 0, "logprobs": None,
                                           "finish_reason": FINISH_OUT[ev.reason]}]))
            elif isinstance(ev, StreamEnd):
                self._done = True
                if self._include_usage:
                    parts.append(self._chunk([], Usage(self._in, self._out, self._cache)))
                parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)
