"""Gemini SSE streams: the upstream decoder (incl. Gemini 3 streamed arguments) and the client encoder."""

from __future__ import annotations

import re
import uuid

import orjson

from adapters.fields import arguments_object, bad_upstream, error_message, upstream_error
from adapters.gemini.errors import render_error
from adapters.gemini.response import _candidate_parts, _response_call, reasoning_out, thought_part
from adapters.gemini.usage import read_usage, render_usage, web_searches
from adapters.gemini.wire import (
    _FINISH_IN,
    _FINISH_OUT,
    CandidateOut,
    FunctionCallPart,
    GenerateContentResponse,
    PartOut,
)
from adapters.internal import (
    NO_CACHE,
    ChatRequest,
    ReasoningDelta,
    ReasoningPart,
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
from adapters.json_types import JSONArray, JSONObject
from adapters.sse import SSEDecoder, SSEEvent
from contracts.errors import ModelyardError


class StreamDecoder(SSEDecoder):
    """Upstream Gemini SSE bytes -> internal stream events (the stream has no terminator)."""

    __slots__ = ("_started", "_finished", "_ntools", "_rid", "_partial")

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._finished = False
        self._ntools = 0
        self._rid = ""  # the stream's responseId: the seed of its calls' ids
        self._partial: _PartialCall | None = None  # a call whose arguments arrive in pieces (Gemini 3)

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        data = ev.data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is list and len(obj) == 1:
            obj = obj[0]
        if type(obj) is not dict:
            self._done = True
            out.append(StreamError("upstream sent a malformed stream chunk", "api_error"))
            return
        if "error" in obj:
            self._done = True
            out.append(StreamError(error_message(data, 500), "api_error"))
            return
        u = obj.get("usageMetadata")
        # Vertex sends usageMetadata without counts (trafficType only): that reports nothing.
        us = read_usage(u) if type(u) is dict and ("promptTokenCount" in u or "candidatesTokenCount" in u) else None
        if not self._started:
            self._started = True
            if us is not None and us.input_tokens:
                # Every chunk carries the prompt's count: the start (Anthropic message_start) reports it.
                out.append(UsageUpdate(us.input_tokens, None, us.cache or None))
            rid, model = obj.get("responseId"), obj.get("modelVersion")
            self._rid = rid if type(rid) is str and rid else uuid.uuid4().hex
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        parts, fr = _candidate_parts(obj)
        for p in parts or ():
            if type(p) is not dict:
                continue
            text = p.get("text")
            if (thought := thought_part(p)) is not None:
                if thought.text:
                    out.append(ReasoningDelta(thought.text))
                if thought.signature:
                    out.append(ReasoningDelta("", thought.signature))
            elif type(text) is str and text:
                out.append(TextDelta(text))
            fc = p.get("functionCall")
            if type(fc) is dict:
                self._function_call(p, fc, out)
        if parts is None:
            pf = obj.get("promptFeedback")
            if type(pf) is dict and pf.get("blockReason"):
                fr = "SAFETY"
        if fr is not None and not self._finished:
            self._finished = True
            reason = _FINISH_IN.get(fr, "stop")
            out.append(StreamFinish("tool_calls" if reason == "stop" and self._ntools else reason))
        searches = web_searches(obj) or None  # grounding's queries, on the chunks that carry them
        if us is not None or searches is not None:
            out.append(UsageUpdate(us.input_tokens if us else None, us.output_tokens if us else None,
                                   (us.cache or None) if us else None, searches))

    def _function_call(self, part: JSONObject, fc: JSONObject, out: list[StreamEvent]) -> None:
        """A whole call, or (streamed arguments) its start, argument pieces and closing `{}`."""
        pending = self._partial
        if pending is not None:
            pieces = fc.get("partialArgs")
            if type(pieces) is list:
                pending.add(pieces)
            if fc.get("willContinue") is True or "name" in fc:
                return
            self._partial = None  # `functionCall: {}` closes the call
            fc, part = {**pending.fc, "args": pending.args}, pending.part
        elif fc.get("willContinue") is True and type(fc.get("name")) is str:
            self._partial = _PartialCall(part, fc)
            return
        if type(fc.get("name")) is not str:
            return
        n = self._ntools
        self._ntools += 1
        tc = _response_call(part, fc, self._rid, n)
        out.append(ToolCallStart(n, tc.id, tc.name, tc.signature))
        out.append(ToolCallDelta(n, tc.arguments))

    def _cut(self) -> StreamEvent:
        # Gemini ends a stream by closing it; only a finishReason tells a whole stream from a cut one.
        return StreamEnd() if self._finished else StreamError("upstream stream ended before finishReason")


_PATH_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)|\[(\d+)\]|\[['\"]([^'\"]+)['\"]\]")


class _PartialCall:
    """A Gemini 3 call streamed with `partialArgs` (jsonPath + value pieces; a string value may
    come in several pieces while `willContinue` is set), assembled into its args object."""

    __slots__ = ("part", "fc", "args", "_open")

    def __init__(self, part: JSONObject, fc: JSONObject) -> None:
        self.part = part  # carries the thoughtSignature, if any
        self.fc = fc
        self.args: JSONObject = {}
        self._open: str | None = None  # path of a string value still arriving

    def add(self, pieces: JSONArray) -> None:
        for piece in pieces:
            if type(piece) is not dict or type(piece.get("jsonPath")) is not str:
                continue
            path = piece["jsonPath"]
            for key in ("stringValue", "numberValue", "boolValue", "nullValue"):
                if key in piece:
                    value = None if key == "nullValue" else piece[key]
                    if key == "stringValue" and self._open == path:
                        value = str(self._get(path) or "") + str(value)
                    self._set(path, value)
                    break
            self._open = path if piece.get("willContinue") is True else None

    def _steps(self, path: str) -> list[str | int]:
        if not path.startswith("$"):
            raise bad_upstream(f"partialArgs jsonPath {path!r}")
        steps: list[str | int] = []
        for m in _PATH_STEP.finditer(path, 1):
            steps.append(int(m[2]) if m[2] is not None else (m[1] or m[3]))
        return steps

    def _get(self, path: str) -> object:
        node: object = self.args
        for step in self._steps(path):
            if type(node) is dict and type(step) is str:
                node = node.get(step)
            elif type(node) is list and type(step) is int and step < len(node):
                node = node[step]
            else:
                return None
        return node

    def _set(self, path: str, value: object) -> None:
        steps = self._steps(path)
        if not steps:
            return
        node: object = self.args
        for step, nxt in zip(steps, steps[1:]):
            child: object = [] if type(nxt) is int else {}
            if type(node) is dict and type(step) is str:
                node = node.setdefault(step, child)
            elif type(node) is list and type(step) is int:
                while len(node) <= step:
                    node.append(None)
                if node[step] is None:
                    node[step] = child
                node = node[step]
            else:
                raise bad_upstream(f"partialArgs jsonPath {path!r} does not fit the arguments so far")
        last = steps[-1]
        if type(node) is dict and type(last) is str:
            node[last] = value
        elif type(node) is list and type(last) is int:
            while len(node) <= last:
                node.append(None)
            node[last] = value
        else:
            raise bad_upstream(f"partialArgs jsonPath {path!r} does not fit the arguments so far")


class StreamEncoder:
    """Internal stream events -> Gemini `data: {candidates..}` SSE bytes for the client."""

    __slots__ = ("_model", "_id", "_done", "_in", "_out", "_cache", "_calls", "_reason")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._id = ""
        self._done = False
        self._in = 0
        self._out = 0
        self._cache = NO_CACHE
        self._calls: dict[int, list[str]] = {}  # tool ordinal -> [name, arguments text so far, signature]
        self._reason = "STOP"

    def _chunk(self, parts: list[PartOut], finish: str | None = None) -> bytes:
        cand: CandidateOut = {"content": {"role": "model", "parts": parts}, "index": 0}
        if not self._id:
            self._id = uuid.uuid4().hex
        obj: GenerateContentResponse
        if finish is None:
            obj = {"candidates": [cand], "modelVersion": self._model, "responseId": self._id}
            if self._in:  # as Gemini does: every chunk counts the prompt once it is known
                obj["usageMetadata"] = render_usage(Usage(self._in, self._out, self._cache))
        else:
            cand["finishReason"] = finish
            obj = {"candidates": [cand], "usageMetadata": render_usage(Usage(self._in, self._out, self._cache)),
                   "modelVersion": self._model, "responseId": self._id}
        return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, ReasoningDelta):
                if (thought := reasoning_out(ReasoningPart(ev.text, ev.signature, ev.redacted))) is not None:
                    parts.append(self._chunk([thought]))
            elif isinstance(ev, TextDelta):
                parts.append(self._chunk([{"text": ev.text}]))
            elif isinstance(ev, ToolCallStart):
                self._calls[ev.index] = [ev.name, "", ev.signature or ""]
            elif isinstance(ev, ToolCallDelta):
                c = self._calls.get(ev.index)
                if c is not None:
                    c[1] += ev.arguments
            elif isinstance(ev, UsageUpdate):
                if ev.input_tokens is not None:
                    self._in = ev.input_tokens
                if ev.output_tokens is not None:
                    self._out = ev.output_tokens
                if ev.cache is not None:
                    self._cache = ev.cache
            elif isinstance(ev, StreamStart):
                if not self._id:
                    self._id = ev.id
            elif isinstance(ev, StreamFinish):
                self._reason = _FINISH_OUT[ev.reason]
            elif isinstance(ev, StreamEnd):
                self._done = True
                # Gemini sends whole function calls, so streamed argument fragments are joined here.
                try:
                    fparts = [self._call_part(*c) for c in self._calls.values()]
                except ModelyardError as e:
                    parts.append(b"data: " + render_error(502, e.message, "api_error") + b"\r\n\r\n")
                    continue
                parts.append(self._chunk(fparts or [{"text": ""}], self._reason))
            elif isinstance(ev, StreamError):
                self._done = True
                parts.append(b"data: " + render_error(500, ev.message, ev.type) + b"\r\n\r\n")
        return b"".join(parts)

    @staticmethod
    def _call_part(name: str, arguments: str, signature: str) -> PartOut:
        part: FunctionCallPart = {"functionCall": {"name": name, "args": arguments_object(arguments, name=name, error=upstream_error)}}
        if signature:
            part["thoughtSignature"] = signature
        return part
