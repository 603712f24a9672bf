"""Responses API SSE streams: the typed-event decoder and encoder (`response.created` ... `response.completed`)."""

from __future__ import annotations

import time
import uuid

import orjson

from adapters.fields import error_message, token_count
from adapters.internal import (
    NO_CACHE,
    ChatRequest,
    FinishReason,
    ReasoningDelta,
    ReasoningPart,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    StreamUntranslatable,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    UsageUpdate,
)
from adapters.json_types import JSONObject
from adapters.responses.response import (
    _call_item,
    _message_item,
    _part,
    _reason_of,
    _reasoning_item,
    _response_object,
    _status,
    item_problem,
    part_problem,
    reasoning_part,
    untranslatable,
)
from adapters.responses.usage import read_usage
from adapters.responses.wire import OutputItem, OutputPart, ResponseObject
from adapters.sse import SSEDecoder, SSEEvent, encode_event


class StreamDecoder(SSEDecoder):
    """Upstream Responses SSE (typed events) -> internal stream events.

    Text, reasoning (summary or raw) and function-call arguments come as deltas; a `.done` event
    whose deltas never came supplies them whole, and a reasoning item's `encrypted_content` (on its
    `output_item.done`) is its part's signature. An output item the internal format cannot carry
    (a hosted tool's call, a custom tool call) ends the stream with `StreamUntranslatable` once the
    upstream completes, after its usage, so a translated stream says why it stopped and a
    passthrough one is still metered.
    """

    __slots__ = ("_started", "_calls", "_argued", "_texted", "_reasoned", "_problem")

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._calls: dict[str, int] = {}  # function_call item id -> tool ordinal
        self._argued: set[str] = set()  # function_call item ids whose arguments have streamed
        self._texted: set[tuple[str, int]] = set()  # (item id, content index) whose text has streamed
        self._reasoned: set[str] = set()  # reasoning item ids whose text has streamed
        self._problem: str | None = None  # the first output the internal format cannot carry

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        try:
            obj = orjson.loads(ev.data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:
            self._done = True
            out.append(StreamError("upstream sent a malformed stream event", "api_error"))
            return
        t = obj.get("type", ev.event)
        if t == "error":
            self._done = True
            out.append(StreamError(error_message(ev.data, 500), "api_error"))
            return
        resp = obj.get("response")
        if t == "response.created" and type(resp) is dict and not self._started:
            self._started = True
            u = resp.get("usage")  # OpenAI's is null here; a server that counts the prompt up front fills it
            if type(u) is dict and token_count(u.get("input_tokens")):
                us = read_usage(u)
                out.append(UsageUpdate(us.input_tokens, None, us.cache or None))
            rid, model = resp.get("id"), resp.get("model")
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        elif t in ("response.completed", "response.incomplete", "response.failed") and type(resp) is dict:
            self._end(t, resp, out)
        elif self._problem is None:  # past an untranslatable item, only the end matters
            self._content(t, obj, out)

    def _content(self, t: object, obj: JSONObject, out: list[StreamEvent]) -> None:
        delta = obj.get("delta")
        if t == "response.output_text.delta" and type(delta) is str:
            self._texted.add((str(obj.get("item_id")), _index(obj.get("content_index"))))
            if delta:
                out.append(TextDelta(delta))
        elif t == "response.output_text.done" and type(obj.get("text")) is str:
            if (str(obj.get("item_id")), _index(obj.get("content_index"))) not in self._texted and obj["text"]:
                out.append(TextDelta(obj["text"]))
        elif t == "response.refusal.delta" and type(delta) is str and delta:
            out.append(TextDelta(delta, refusal=True))
        elif t in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            if type(delta) is str and delta:
                self._reasoned.add(str(obj.get("item_id")))
                out.append(ReasoningDelta(delta))
        elif t == "response.reasoning_summary_part.added":
            if str(obj.get("item_id")) in self._reasoned:
                out.append(ReasoningDelta("\n\n"))  # a later summary part: a paragraph of its own
        elif t == "response.content_part.added":
            self._problem = part_problem(obj.get("part"))
        elif t in ("response.output_item.added", "response.output_item.done"):
            item = obj.get("item")
            if type(item) is not dict:
                return
            self._problem = item_problem(item)
            if self._problem is None and item.get("type") == "function_call":
                self._call(item, t == "response.output_item.done", out)
            elif item.get("type") == "reasoning" and t == "response.output_item.done":
                self._reasoning_done(item, out)
        elif t == "response.function_call_arguments.delta":
            iid = str(obj.get("item_id"))
            idx = self._calls.get(iid)
            if idx is not None and type(delta) is str and delta:
                self._argued.add(iid)
                out.append(ToolCallDelta(idx, delta))

    def _reasoning_done(self, item: JSONObject, out: list[StreamEvent]) -> None:
        part = reasoning_part(item)
        if str(item.get("id")) not in self._reasoned and part.text:
            out.append(ReasoningDelta(part.text))  # a summary that came whole, with no deltas before it
        if part.signature:
            out.append(ReasoningDelta("", part.signature))

    def _call(self, item: JSONObject, done: bool, out: list[StreamEvent]) -> None:
        iid = str(item.get("id"))
        if iid not in self._calls:
            n = self._calls[iid] = len(self._calls)
            cid, name = item.get("call_id"), item.get("name")
            out.append(ToolCallStart(n, cid if type(cid) is str else f"call_{n}", name if type(name) is str else ""))
        args = item.get("arguments")
        if done and iid not in self._argued and type(args) is str and args:
            self._argued.add(iid)  # arguments that came whole, with no deltas before them
            out.append(ToolCallDelta(self._calls[iid], args))

    def _end(self, t: str, resp: JSONObject, out: list[StreamEvent]) -> None:
        self._done = True
        if t == "response.failed":
            err = resp.get("error")
            msg = err.get("message") if type(err) is dict else None
            out.append(StreamError(msg if type(msg) is str else "upstream response failed", "api_error"))
            return
        u = read_usage(resp.get("usage"), resp.get("output"))
        if self._problem is not None:
            out += [UsageUpdate(u.input_tokens, u.output_tokens, u.cache or None, u.web_searches or None),
                    StreamUntranslatable(untranslatable(self._problem), "api_error")]
            return
        out += [StreamFinish(_reason_of(resp, bool(self._calls))),
                UsageUpdate(u.input_tokens, u.output_tokens, u.cache or None, u.web_searches or None),
                StreamEnd()]

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before response.completed", "api_error")


def _index(raw: object) -> int:
    return raw if type(raw) is int else 0


class _OpenCall:
    __slots__ = ("output_index", "item_id", "call_id", "name", "signature", "arguments")

    def __init__(self, output_index: int, item_id: str, call_id: str, name: str, signature: str | None) -> None:
        self.output_index = output_index
        self.item_id = item_id
        self.call_id = call_id
        self.name = name
        self.signature = signature
        self.arguments: list[str] = []


class StreamEncoder:
    """Internal stream events -> the Responses API's typed SSE events for the client.

    Each event carries a `sequence_number`; a text run is one `message` output item with one
    `output_text` part; each tool call is a `function_call` item, kept open until the finish so
    interleaved (parallel) argument deltas still land before their item's `done` events.
    """

    __slots__ = ("_model", "_request", "_base", "_id", "_created", "_seq", "_started", "_done", "_output",
                 "_text_index", "_text_id", "_parts", "_kind", "_text", "_calls", "_in", "_out", "_cache", "_reason",
                 "_refused", "_rs_index", "_rs_text")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._request = request
        self._base = uuid.uuid4().hex  # one random draw per stream; item ids add their output index
        self._id = "resp_" + self._base
        self._created = int(time.time())
        self._seq = 0
        self._started = False
        self._done = False
        self._output: list[OutputItem | None] = []  # finished output items, by output_index
        self._text_index: int | None = None  # output_index of the open message item
        self._text_id = ""
        self._parts: list[OutputPart] = []  # the open message's finished content parts
        self._kind = ""  # the open part's kind: output_text or refusal
        self._text: list[str] = []  # the open part's text so far
        self._calls: dict[int, _OpenCall] = {}  # tool ordinal -> open function_call item
        self._in = 0
        self._out = 0
        self._cache = NO_CACHE
        self._reason: FinishReason | None = None
        self._refused = False  # a refusal part streamed
        self._rs_index: int | None = None  # output_index of the open reasoning item
        self._rs_text: list[str] = []  # its summary text so far

    def _emit(self, parts: list[bytes], kind: str, payload: JSONObject) -> None:
        payload = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        parts.append(encode_event(orjson.dumps(payload), kind))

    def _snapshot(self, status: str, error: str | None = None) -> ResponseObject:
        usage = Usage(self._in, self._out, self._cache) if status != "in_progress" else None
        output = [i for i in self._output if i]  # items still open are not in the snapshot
        return _response_object(self._id, self._created, self._model, output, status, self._reason, usage,
                                self._request, error)

    def _start(self, parts: list[bytes]) -> None:
        self._started = True
        self._emit(parts, "response.created", {"response": self._snapshot("in_progress")})
        self._emit(parts, "response.in_progress", {"response": self._snapshot("in_progress")})

    def _slot(self) -> int:
        self._output.append(None)  # placeholder until the item is done
        return len(self._output) - 1

    def _text_delta(self, text: str, kind: str, parts: list[bytes]) -> None:
        """Text of kind output_text or refusal: one message item, one content part per run of a kind."""
        if self._text_index is None:
            self._text_index, self._parts, self._kind = self._slot(), [], ""
            self._text_id = f"msg_{self._base}_{self._text_index}"
            item = _message_item(self._text_id, [], "in_progress")
            self._emit(parts, "response.output_item.added", {"output_index": self._text_index, "item": item})
        if kind != self._kind:
            self._close_part(parts)
            self._kind, self._text = kind, []
            self._emit(parts, "response.content_part.added", {
                "item_id": self._text_id, "output_index": self._text_index, "content_index": len(self._parts),
                "part": _part(kind, "")})
        self._text.append(text)
        where = {"item_id": self._text_id, "output_index": self._text_index, "content_index": len(self._parts)}
        if kind == "refusal":
            self._emit(parts, "response.refusal.delta", {**where, "delta": text})
        else:
            self._emit(parts, "response.output_text.delta", {**where, "delta": text, "logprobs": []})

    def _close_part(self, parts: list[bytes]) -> None:
        if not self._kind:
            return
        text, kind = "".join(self._text), self._kind
        where = {"item_id": self._text_id, "output_index": self._text_index, "content_index": len(self._parts)}
        if kind == "refusal":
            self._emit(parts, "response.refusal.done", {**where, "refusal": text})
        else:
            self._emit(parts, "response.output_text.done", {**where, "text": text, "logprobs": []})
        part = _part(kind, text)
        self._emit(parts, "response.content_part.done", {**where, "part": part})
        self._parts.append(part)
        self._kind = ""

    def _close_text(self, parts: list[bytes], status: str) -> None:
        if self._text_index is None:
            return
        self._close_part(parts)
        idx, iid = self._text_index, self._text_id
        self._text_index = None
        item = _message_item(iid, self._parts, status)
        self._output[idx] = item
        self._emit(parts, "response.output_item.done", {"output_index": idx, "item": item})

    def _close_calls(self, parts: list[bytes], status: str) -> None:
        for n in sorted(self._calls, key=lambda k: self._calls[k].output_index):
            c = self._calls[n]
            if not c.arguments:  # no arguments is "{}" on every path, as the whole answer says it
                c.arguments.append("{}")
                self._emit(parts, "response.function_call_arguments.delta", {
                    "item_id": c.item_id, "output_index": c.output_index, "delta": "{}"})
            args = "".join(c.arguments)
            self._emit(parts, "response.function_call_arguments.done", {
                "item_id": c.item_id, "output_index": c.output_index, "name": c.name, "arguments": args})
            item = _call_item(c.item_id, ToolCall(c.call_id, c.name, args, c.signature), status)
            self._output[c.output_index] = item
            self._emit(parts, "response.output_item.done", {"output_index": c.output_index, "item": item})
        self._calls.clear()

    def _reasoning(self, ev: ReasoningDelta, parts: list[bytes]) -> None:
        """Reasoning is one `reasoning` item per part, its text one summary part; a signature closes it."""
        if self._rs_index is None or ev.redacted:
            self._close_reasoning(parts, None)
            self._close_text(parts, "completed")
            self._rs_index, self._rs_text = self._slot(), []
            item = _reasoning_item(self._rs_id(), ReasoningPart())
            self._emit(parts, "response.output_item.added", {"output_index": self._rs_index, "item": item})
        if ev.text:
            where = {"item_id": self._rs_id(), "output_index": self._rs_index, "summary_index": 0}
            if not self._rs_text:
                self._emit(parts, "response.reasoning_summary_part.added",
                           {**where, "part": {"type": "summary_text", "text": ""}})
            self._rs_text.append(ev.text)
            self._emit(parts, "response.reasoning_summary_text.delta", {**where, "delta": ev.text})
        if ev.signature is not None:
            self._close_reasoning(parts, ev.signature)

    def _rs_id(self) -> str:
        return f"rs_{self._base}_{self._rs_index}"

    def _close_reasoning(self, parts: list[bytes], signature: str | None) -> None:
        if self._rs_index is None:
            return
        text = "".join(self._rs_text)
        where = {"item_id": self._rs_id(), "output_index": self._rs_index, "summary_index": 0}
        if text:
            self._emit(parts, "response.reasoning_summary_text.done", {**where, "text": text})
            self._emit(parts, "response.reasoning_summary_part.done",
                       {**where, "part": {"type": "summary_text", "text": text}})
        item = _reasoning_item(self._rs_id(), ReasoningPart(text, signature))
        self._output[self._rs_index] = item
        self._emit(parts, "response.output_item.done", {"output_index": self._rs_index, "item": item})
        self._rs_index, self._rs_text = None, []

    def _close_all(self, parts: list[bytes]) -> None:
        self._close_reasoning(parts, None)
        status = "incomplete" if self._reason is not None and _status(self._reason, self._refused) == "incomplete" \
            else "completed"
        self._close_text(parts, status)
        self._close_calls(parts, status)

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
            if not self._started:
                self._start(parts)
            if isinstance(ev, StreamStart):
                continue
            if isinstance(ev, ReasoningDelta):
                self._reasoning(ev, parts)
            elif isinstance(ev, TextDelta):
                if ev.text:
                    self._close_reasoning(parts, None)
                    self._refused = self._refused or ev.refusal
                    self._text_delta(ev.text, "refusal" if ev.refusal else "output_text", parts)
            elif isinstance(ev, ToolCallStart):
                self._close_reasoning(parts, None)
                self._close_text(parts, "completed")
                slot = self._slot()
                c = _OpenCall(slot, f"fc_{self._base}_{slot}", ev.id, ev.name, ev.signature)
                self._calls[ev.index] = c
                item = _call_item(c.item_id, ToolCall(ev.id, ev.name, "", ev.signature), "in_progress")
                item["arguments"] = ""  # what streams in comes as deltas
                self._emit(parts, "response.output_item.added", {"output_index": c.output_index, "item": item})
            elif isinstance(ev, ToolCallDelta):
                call = self._calls.get(ev.index)
                if call is not None and ev.arguments:
                    call.arguments.append(ev.arguments)
                    self._emit(parts, "response.function_call_arguments.delta", {
                        "item_id": call.item_id, "output_index": call.output_index, "delta": ev.arguments})
            elif isinstance(ev, StreamFinish):
                self._reason = ev.reason
                self._close_all(parts)
            elif isinstance(ev, StreamEnd):
                self._done = True
                if self._reason is None:
                    self._reason = "tool_calls" if self._calls else "stop"
                self._close_all(parts)
                status = _status(self._reason, self._refused)
                error = "the model stopped with an error" if status == "failed" else None
                self._emit(parts, f"response.{status}", {"response": self._snapshot(status, error)})
            elif isinstance(ev, StreamError):
                self._done = True
                self._close_all(parts)
                self._emit(parts, "response.failed", {"response": self._snapshot("failed", ev.message)})
        return b"".join(parts)
