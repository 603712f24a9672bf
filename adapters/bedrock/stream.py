"""ConverseStream: eventstream frames <-> internal stream events.

Each frame's `:message-type` is `event` (`:event-type` messageStart, contentBlockStart,
contentBlockDelta, contentBlockStop, messageStop, metadata), `exception` (`:exception-type`,
payload `{"message"}`) or `error` (`:error-code`, `:error-message`). The stream has no
terminator: `metadata` is its last event, and a stream cut before `messageStop` is an error.
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters.bedrock.eventstream import CorruptStream, Frame, FrameDecoder, encode_frame
from adapters.bedrock.response import _FINISH_OUT, FINISH_IN
from adapters.bedrock.usage import read_usage, render_usage
from adapters.internal import (
    ChatRequest,
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

__all__ = ["StreamDecoder", "StreamEncoder", "BAD_GATEWAY"]

# The caller's stream ends with this error (its status line went out at 200 already).
BAD_GATEWAY = "upstream sent a corrupt eventstream (502 Bad Gateway)"


def _text(v: object) -> str:
    return v if type(v) is str else ""


class StreamDecoder:
    """Upstream eventstream bytes -> internal stream events, frames split anywhere."""

    __slots__ = ("_frames", "_started", "_stopped", "_done", "_tools")

    def __init__(self) -> None:
        self._frames = FrameDecoder()
        self._started = False
        self._stopped = False  # messageStop seen: a close without metadata is still a whole answer
        self._done = False
        self._tools: dict[int, int] = {}  # contentBlockIndex -> tool call ordinal

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        if self._done:
            return []
        out: list[StreamEvent] = []
        try:
            frames = self._frames.feed(chunk)
        except CorruptStream as e:
            self._done = True
            return [StreamError(f"{BAD_GATEWAY}: {e}", "api_error")]
        for f in frames:
            self._frame(f, out)
            if self._done:
                break
        return out

    def close(self) -> list[StreamEvent]:
        if self._done:
            return []
        self._done = True
        if self._stopped and not self._frames.pending:
            return [StreamEnd()]
        return [StreamError("upstream eventstream ended before messageStop", "api_error")]

    def _start(self, out: list[StreamEvent]) -> None:
        if not self._started:
            self._started = True
            out.append(StreamStart("", ""))  # Bedrock's stream names neither (x-amzn-requestid is a header)

    def _frame(self, f: Frame, out: list[StreamEvent]) -> None:
        kind = f.headers.get(":message-type")
        if kind == "exception":
            self._done = True
            try:
                msg = _text(orjson.loads(f.payload).get("message"))
            except (orjson.JSONDecodeError, AttributeError):
                msg = ""
            out.append(StreamError(f"upstream {_text(f.headers.get(':exception-type')) or 'exception'}"
                                   + (f": {msg}" if msg else ""), "api_error"))
            return
        if kind != "event":
            self._done = True
            out.append(StreamError(f"upstream error {_text(f.headers.get(':error-code'))}: "
                                   f"{_text(f.headers.get(':error-message'))}", "api_error"))
            return
        try:
            obj = orjson.loads(f.payload)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:
            self._done = True
            out.append(StreamError(f"{BAD_GATEWAY}: an event's payload is not a JSON object", "api_error"))
            return
        self._start(out)
        event = f.headers.get(":event-type")
        if event == "contentBlockStart":
            tu = (obj.get("start") or {}).get("toolUse") if type(obj.get("start")) is dict else None
            if type(tu) is dict:
                n = self._tools[obj.get("contentBlockIndex", -1)] = len(self._tools)
                out.append(ToolCallStart(n, _text(tu.get("toolUseId")) or f"call_{n}", _text(tu.get("name"))))
        elif event == "contentBlockDelta":
            delta = obj.get("delta")
            if type(delta) is not dict:
                return
            if type(delta.get("text")) is str and delta["text"]:
                out.append(TextDelta(delta["text"]))
            elif type(delta.get("toolUse")) is dict:
                call = self._tools.get(obj.get("contentBlockIndex", -1))
                args = _text(delta["toolUse"].get("input"))
                if call is not None and args:
                    out.append(ToolCallDelta(call, args))
        elif event == "messageStop":
            self._stopped = True
            reason = obj.get("stopReason")
            out.append(StreamFinish(FINISH_IN.get(reason, "stop") if type(reason) is str else "stop"))
        elif event == "metadata":
            usage = obj.get("usage")
            if type(usage) is dict:
                u = read_usage(usage)
                out.append(UsageUpdate(u.input_tokens, u.output_tokens, u.cache or None))
            if self._stopped:
                self._done = True
                out.append(StreamEnd())


def _event(event_type: str, payload: dict[str, Any]) -> bytes:
    return encode_frame({":event-type": event_type, ":content-type": "application/json", ":message-type": "event"},
                        orjson.dumps(payload))


class StreamEncoder:
    """Internal stream events -> ConverseStream frames (the demo upstream's stream)."""

    __slots__ = ("_block", "_open", "_usage", "_done")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._block = 0  # the current content block's index
        self._open = False
        self._usage = Usage()
        self._done = False

    def _close_block(self, parts: list[bytes]) -> None:
        if self._open:
            parts.append(_event("contentBlockStop", {"contentBlockIndex": self._block}))
            self._block += 1
            self._open = False

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, StreamStart):
                parts.append(_event("messageStart", {"role": "assistant"}))
            elif isinstance(ev, TextDelta):
                self._open = True
                parts.append(_event("contentBlockDelta", {"contentBlockIndex": self._block, "delta": {"text": ev.text}}))
            elif isinstance(ev, ToolCallStart):
                self._close_block(parts)
                self._open = True
                parts.append(_event("contentBlockStart", {"contentBlockIndex": self._block, "start": {
                    "toolUse": {"toolUseId": ev.id, "name": ev.name}}}))
            elif isinstance(ev, ToolCallDelta):
                parts.append(_event("contentBlockDelta", {"contentBlockIndex": self._block,
                                                          "delta": {"toolUse": {"input": ev.arguments}}}))
            elif isinstance(ev, StreamFinish):
                self._close_block(parts)
                parts.append(_event("messageStop", {"stopReason": _FINISH_OUT[ev.reason]}))
            elif isinstance(ev, UsageUpdate):
                u = self._usage
                self._usage = Usage(u.input_tokens if ev.input_tokens is None else ev.input_tokens,
                                    u.output_tokens if ev.output_tokens is None else ev.output_tokens,
                                    u.cache if ev.cache is None else ev.cache)
            elif isinstance(ev, StreamEnd):
                self._done = True
                parts.append(_event("metadata", {"usage": render_usage(self._usage),
                                                 "metrics": {"latencyMs": 1}}))
            elif isinstance(ev, StreamError):
                self._done = True
                parts.append(encode_frame({":exception-type": "internalServerException",
                                           ":content-type": "application/json", ":message-type": "exception"},
                                          orjson.dumps({"message": ev.message})))
        return b"".join(parts)
