"""Anthropic SSE streams: the upstream decoder and the client encoder (one block open at a time)."""

from __future__ import annotations

import uuid

import orjson

from adapters.anthropic.render import tool_id
from adapters.anthropic.usage import READ, WRITE, cache_of, one_hour_writes, render_usage, web_searches
from adapters.anthropic.wire import (
    _FINISH_IN,
    _FINISH_OUT,
    _INPUT_KINDS,
    JSON_TOOL,
    AnswerBlock,
    StreamEventOut,
    ToolUseBlock,
)
from adapters.call_ids import with_signature
from adapters.fields import arguments_object, token_count, upstream_error
from adapters.internal import (
    NO_CACHE,
    CacheTokens,
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
from adapters.json_types import JSONObject
from adapters.sse import SSEDecoder, SSEEvent, encode_event
from contracts.errors import ModelyardError


class StreamDecoder(SSEDecoder):
    """Upstream Anthropic SSE bytes -> internal stream events."""

    __slots__ = ("_blocks", "_ntools", "_json_blocks", "_input", "_write_1h")

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, int] = {}  # content block index -> tool ordinal (tool_use blocks only)
        self._ntools = 0
        self._json_blocks: set[int] = set()  # blocks of our structured-output tool: their input is text
        # Prompt tokens by kind: message_delta may report any of them alone, cumulatively.
        self._input = dict.fromkeys(_INPUT_KINDS, 0)
        self._write_1h = 0  # of the cache writes, those with a 1-hour TTL

    def _input_update(self, u: JSONObject) -> int | None:
        seen = False
        for k in _INPUT_KINDS:
            if k in u:
                self._input[k] = token_count(u[k])
                seen = True
        return sum(self._input.values()) if seen else None

    def _cache_update(self, u: JSONObject) -> CacheTokens | None:
        """The cache part of the input, when this event reports any of it (after `_input_update`)."""
        if "cache_creation" in u:
            self._write_1h = one_hour_writes(u)
        if READ not in u and WRITE not in u:
            return None
        return cache_of(self._input[READ], self._input[WRITE], self._write_1h) or None

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        name, data = ev.event, ev.data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:
            self._done = True
            out.append(StreamError("upstream sent a malformed stream event", "api_error"))
            return
        t = obj.get("type", name)
        if t == "content_block_delta":
            d = obj.get("delta")
            if type(d) is not dict:
                return
            dt = d.get("type")
            if dt == "text_delta":
                text = d.get("text")
                if type(text) is str and text:
                    out.append(TextDelta(text))
            elif dt == "thinking_delta":
                thought = d.get("thinking")
                if type(thought) is str and thought:
                    out.append(ReasoningDelta(thought))
            elif dt == "signature_delta":
                sig = d.get("signature")
                if type(sig) is str and sig:
                    out.append(ReasoningDelta("", sig))
            elif dt == "input_json_delta":
                pj = d.get("partial_json")
                idx = obj.get("index")
                if type(pj) is not str or not pj or type(idx) is not int:
                    return
                if idx in self._json_blocks:
                    out.append(TextDelta(pj))
                    return
                tool = self._blocks.get(idx)
                if tool is not None:
                    out.append(ToolCallDelta(tool, pj))
        elif t == "content_block_start":
            b = obj.get("content_block")
            if type(b) is not dict:
                return
            if b.get("type") == "text":
                text = b.get("text")
                if type(text) is str and text:
                    out.append(TextDelta(text))
            elif b.get("type") == "thinking":
                thought, sig = b.get("thinking"), b.get("signature")
                if type(thought) is str and thought:
                    out.append(ReasoningDelta(thought))
                if type(sig) is str and sig:
                    out.append(ReasoningDelta("", sig))
            elif b.get("type") == "redacted_thinking" and type(b.get("data")) is str:
                out.append(ReasoningDelta("", b["data"], redacted=True))
            elif b.get("type") == "tool_use":
                idx, tid, tname = obj.get("index"), b.get("id"), b.get("name")
                inp = b.get("input")
                if tname == JSON_TOOL:
                    if type(idx) is int:
                        self._json_blocks.add(idx)
                    if type(inp) is dict and inp:
                        out.append(TextDelta(orjson.dumps(inp).decode()))
                    return
                n = self._ntools
                self._ntools += 1
                if type(idx) is int:
                    self._blocks[idx] = n
                out.append(ToolCallStart(n, tid if type(tid) is str else f"call_{n}",
                                         tname if type(tname) is str else ""))
                if type(inp) is dict and inp:
                    out.append(ToolCallDelta(n, orjson.dumps(inp).decode()))
        elif t == "message_start":
            msg = obj.get("message")
            msg = msg if type(msg) is dict else {}
            u = msg.get("usage")
            if type(u) is dict:
                # Usage first, so an encoder can put input tokens into its own start event.
                out.append(UsageUpdate(self._input_update(u) or 0, token_count(u.get("output_tokens")),
                                       self._cache_update(u)))
            rid, model = msg.get("id"), msg.get("model")
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        elif t == "message_delta":
            d = obj.get("delta")
            if type(d) is dict and type(d.get("stop_reason")) is str:
                reason = _FINISH_IN.get(d["stop_reason"], "stop")
                if reason == "tool_calls" and self._json_blocks and not self._ntools:
                    reason = "stop"  # only the structured-output tool ran: that was the answer
                out.append(StreamFinish(reason))
            u = obj.get("usage")
            if type(u) is dict:
                out.append(UsageUpdate(self._input_update(u), token_count(u.get("output_tokens")), self._cache_update(u),
                                       web_searches(u) or None))
        elif t == "message_stop":
            self._done = True
            out.append(StreamEnd())
        elif t == "error":
            err = obj.get("error")
            err = err if type(err) is dict else {}
            msg, et = err.get("message"), err.get("type")
            self._done = True
            out.append(StreamError(msg if type(msg) is str else "upstream stream error",
                                   et if type(et) is str else "api_error"))
        # ping, content_block_stop and unknown events carry nothing to translate.

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before message_stop", "api_error")


def _sse_event(obj: StreamEventOut) -> bytes:
    # Anthropic names every SSE event after its payload's `type`.
    return encode_event(orjson.dumps(obj), obj["type"])


class _Held:
    """A block that could not open yet (a tool call is streaming): its start and deltas, in order."""

    __slots__ = ("tool", "kind", "deltas", "signature")

    def __init__(self, tool: ToolCallStart | None, kind: str = "text") -> None:
        self.tool = tool
        self.kind = "tool" if tool is not None else kind  # text, tool, thinking or redacted_thinking
        self.deltas: list[str] = []
        self.signature: str | None = None  # a thinking block's (ends it), a redacted block's data


class StreamEncoder:
    """Internal stream events -> Anthropic Messages SSE bytes for the client.

    Anthropic streams one block at a time, but other protocols interleave parallel tool calls
    (deltas of call 0 after call 1 started). So once a tool block is open it stays open until
    the stream ends, and whatever starts after it is held and sent, in order, at the end."""

    __slots__ = ("_model", "_started", "_done", "_in", "_out", "_cache", "_text", "_thinking", "_tool", "_next", "_held",
                 "_held_tools", "_args", "_reason")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._started = False
        self._done = False
        self._in = 0
        self._out = 0
        self._cache = NO_CACHE
        self._text: int | None = None  # block index of the open text block
        self._thinking: int | None = None  # block index of the open thinking block
        self._tool: tuple[int, int] | None = None  # (tool ordinal, block index) of the open tool block
        self._next = 0
        self._held: list[_Held] = []
        self._held_tools: dict[int, _Held] = {}
        self._args: dict[int, list[str]] = {}  # tool ordinal -> argument fragments (checked at the end)
        self._reason = "end_turn"

    def _start(self, rid: str, parts: list[bytes]) -> None:
        self._started = True
        parts.append(_sse_event({"type": "message_start", "message": {
            "id": rid or "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": self._model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": render_usage(Usage(self._in, self._out, self._cache)),
        }}))

    def _open(self, block: AnswerBlock, parts: list[bytes]) -> int:
        index = self._next
        self._next += 1
        parts.append(_sse_event({"type": "content_block_start", "index": index, "content_block": block}))
        return index

    @staticmethod
    def _text_delta(index: int, text: str) -> bytes:
        return _sse_event({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}})

    @staticmethod
    def _json_delta(index: int, fragment: str) -> bytes:
        return _sse_event({"type": "content_block_delta", "index": index,
                           "delta": {"type": "input_json_delta", "partial_json": fragment}})

    @staticmethod
    def _tool_block(ev: ToolCallStart) -> ToolUseBlock:
        # A Gemini thought signature rides in the id, which the client hands back next turn.
        return {"type": "tool_use", "id": tool_id(with_signature(ev.id, ev.signature)), "name": ev.name, "input": {}}

    @staticmethod
    def _thinking_delta(index: int, thought: str) -> bytes:
        return _sse_event({"type": "content_block_delta", "index": index,
                           "delta": {"type": "thinking_delta", "thinking": thought}})

    @staticmethod
    def _signature_delta(index: int, signature: str) -> bytes:
        return _sse_event({"type": "content_block_delta", "index": index,
                           "delta": {"type": "signature_delta", "signature": signature}})

    def _close_thinking(self, parts: list[bytes]) -> None:
        if self._thinking is not None:
            parts.append(_sse_event({"type": "content_block_stop", "index": self._thinking}))
            self._thinking = None

    def _on_reasoning(self, ev: ReasoningDelta, parts: list[bytes]) -> None:
        """Reasoning as thinking blocks (a signature ends one), redacted reasoning as redacted_thinking."""
        if self._tool is not None:
            last = self._held[-1] if self._held else None
            if ev.redacted or last is None or last.kind != "thinking" or last.signature is not None:
                last = _Held(None, "redacted_thinking" if ev.redacted else "thinking")
                self._held.append(last)
            if ev.text:
                last.deltas.append(ev.text)
            last.signature = ev.signature
            return
        if self._text is not None:
            parts.append(_sse_event({"type": "content_block_stop", "index": self._text}))
            self._text = None
        if ev.redacted:
            self._close_thinking(parts)
            index = self._open({"type": "redacted_thinking", "data": ev.signature or ""}, parts)
            parts.append(_sse_event({"type": "content_block_stop", "index": index}))
            return
        if self._thinking is None:
            self._thinking = self._open({"type": "thinking", "thinking": "", "signature": ""}, parts)
        if ev.text:
            parts.append(self._thinking_delta(self._thinking, ev.text))
        if ev.signature is not None:
            parts.append(self._signature_delta(self._thinking, ev.signature))
            self._close_thinking(parts)

    def _on_text(self, text: str, parts: list[bytes]) -> None:
        if self._tool is not None:
            if not self._held or self._held[-1].kind != "text":
                self._held.append(_Held(None))
            self._held[-1].deltas.append(text)
            return
        self._close_thinking(parts)
        if self._text is None:
            self._text = self._open({"type": "text", "text": ""}, parts)
        parts.append(self._text_delta(self._text, text))

    def _on_tool(self, ev: ToolCallStart, parts: list[bytes]) -> None:
        self._args[ev.index] = []
        if self._tool is not None:
            held = _Held(ev)
            self._held.append(held)
            self._held_tools[ev.index] = held
            return
        if self._text is not None:
            parts.append(_sse_event({"type": "content_block_stop", "index": self._text}))
            self._text = None
        self._close_thinking(parts)
        self._tool = (ev.index, self._open(self._tool_block(ev), parts))

    def _on_args(self, ev: ToolCallDelta, parts: list[bytes]) -> None:
        args = self._args.get(ev.index)
        if args is None:
            return
        args.append(ev.arguments)
        if self._tool is not None and self._tool[0] == ev.index:
            parts.append(self._json_delta(self._tool[1], ev.arguments))
        elif ev.index in self._held_tools:
            self._held_tools[ev.index].deltas.append(ev.arguments)

    def _flush(self, parts: list[bytes]) -> str | None:
        """Close the open block and send the held ones; a malformed call's message, if any."""
        for _ordinal, frags in self._args.items():
            try:
                arguments_object("".join(frags), error=upstream_error)
            except ModelyardError as e:
                return e.message
        for index in (self._text, self._thinking, self._tool[1] if self._tool else None):
            if index is not None:
                parts.append(_sse_event({"type": "content_block_stop", "index": index}))
        self._text = self._thinking = self._tool = None
        for held in self._held:
            if held.kind == "redacted_thinking":
                index = self._open({"type": "redacted_thinking", "data": held.signature or ""}, parts)
            elif held.kind == "thinking":
                index = self._open({"type": "thinking", "thinking": "", "signature": ""}, parts)
                parts.extend(self._thinking_delta(index, t) for t in held.deltas)
                if held.signature is not None:
                    parts.append(self._signature_delta(index, held.signature))
            elif held.tool is None:
                index = self._open({"type": "text", "text": ""}, parts)
                parts.extend(self._text_delta(index, t) for t in held.deltas)
            else:
                index = self._open(self._tool_block(held.tool), parts)
                parts.extend(self._json_delta(index, a) for a in held.deltas)
            parts.append(_sse_event({"type": "content_block_stop", "index": index}))
        self._held.clear()
        return None

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, UsageUpdate):
                if ev.input_tokens is not None:
                    self._in = ev.input_tokens
                if ev.output_tokens is not None:
                    self._out = ev.output_tokens
                if ev.cache is not None:
                    self._cache = ev.cache
                continue
            if isinstance(ev, StreamStart):
                if not self._started:
                    self._start(ev.id, parts)
                continue
            if isinstance(ev, StreamError):
                self._done = True
                parts.append(_sse_event({"type": "error", "error": {"type": ev.type, "message": ev.message}}))
                continue
            if not self._started:
                self._start("", parts)
            if isinstance(ev, ReasoningDelta):
                self._on_reasoning(ev, parts)
            elif isinstance(ev, TextDelta):
                self._on_text(ev.text, parts)
            elif isinstance(ev, ToolCallStart):
                self._on_tool(ev, parts)
            elif isinstance(ev, ToolCallDelta):
                self._on_args(ev, parts)
            elif isinstance(ev, StreamFinish):
                self._reason = _FINISH_OUT[ev.reason]
            elif isinstance(ev, StreamEnd):
                self._done = True
                bad = self._flush(parts)
                if bad is not None:
                    parts.append(_sse_event({"type": "error", "error": {"type": "api_error", "message": bad}}))
                    continue
                parts.append(_sse_event({"type": "message_delta",
                                         "delta": {"stop_reason": self._reason, "stop_sequence": None},
                                         "usage": render_usage(Usage(self._in, self._out, self._cache))}))
                parts.append(_sse_event({"type": "message_stop"}))
        return b"".join(parts)
