"""Anthropic Messages <-> internal format (POST /v1/messages), pure functions."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Literal

import orjson

from adapters.fields import (
    arguments_object,
    as_object,
    bad_upstream,
    error_message,
    header,
    load_object,
    opt_bool,
    opt_int,
    opt_list,
    opt_number,
    opt_str,
    req_str,
    token_count,
)
from adapters.internal import (
    ChatRequest,
    ChatResponse,
    ContentPart,
    FinishReason,
    ImagePart,
    Message,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolChoice,
    ToolDef,
    UpstreamRequest,
    Usage,
    UsageUpdate,
    message_text,
)
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from adapters.sse import SSEDecoder, SSEEvent, encode_event
from modelyard.errors import ClientError, default_type

__all__ = [
    "PATH", "API_VERSION", "DEFAULT_MAX_TOKENS", "CLIENT_AUTH_HEADERS", "parse_request",
    "request_target", "render_request", "parse_response", "render_response", "StreamDecoder", "StreamEncoder",
    "render_error", "parse_error", "client_api_key",
]

PATH = "/v1/messages"
API_VERSION = "2023-06-01"
# Anthropic requires max_tokens; clients of other protocols may omit it.
DEFAULT_MAX_TOKENS = 4096
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("x-api-key", "authorization")

_FINISH_IN: dict[str, FinishReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
    "refusal": "content_filter", "pause_turn": "stop", "model_context_window_exceeded": "length",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal",
    "error": "end_turn",
}


# ---- request -------------------------------------------------------------------------------


def _image(block: dict, where: str) -> ImagePart:
    src = as_object(block.get("source"), f"{where}.source")
    st = src.get("type")
    if st == "base64":
        return ImagePart(media_type=opt_str(src, "media_type", f"{where}.source"),
                         data=req_str(src, "data", f"{where}.source"))
    if st == "url":
        return ImagePart(url=req_str(src, "url", f"{where}.source"))
    raise ClientError(f"{where}.source.type {st!r} is not supported")


def _text_blocks(raw: object, where: str) -> str:
    """A system prompt or tool_result content: a string or text blocks (images there are dropped)."""
    if raw is None:
        return ""
    if type(raw) is str:
        return raw
    if type(raw) is not list:
        raise ClientError(f"{where} must be a string or an array of blocks")
    check_count(raw, MAX_CONTENT_PARTS, f"{where} blocks")
    out = []
    for j, b in enumerate(raw):
        b = as_object(b, f"{where}[{j}]")
        if b.get("type") == "text":
            t = b.get("text")
            if type(t) is not str:
                raise ClientError(f"{where}[{j}].text must be a string")
            out.append(t)
        elif b.get("type") != "image":
            raise ClientError(f"{where}[{j}].type {b.get('type')!r} is not supported")
    return "".join(out)


def _turn(m: object, where: str, names: dict[str, str], msgs: list[Message]) -> None:
    """One `messages[i]` turn appended to msgs; each tool_result block becomes its own tool message."""
    m = as_object(m, where)
    role = m.get("role")
    if role != "user" and role != "assistant":
        raise ClientError(f"{where}.role {role!r} must be 'user' or 'assistant'")
    content = m.get("content")
    if type(content) is str:
        msgs.append(Message(role, (TextPart(content),)))
        return
    if type(content) is not list or not content:
        raise ClientError(f"{where}.content must be a string or a non-empty array")
    check_count(content, MAX_CONTENT_PARTS, f"{where}.content blocks")
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    for j, b in enumerate(content):
        bw = f"{where}.content[{j}]"
        b = as_object(b, bw)
        t = b.get("type")
        if t == "text":
            text = b.get("text")
            if type(text) is not str:
                raise ClientError(f"{bw}.text must be a string")
            parts.append(TextPart(text))
        elif t == "image" and role == "user":
            parts.append(_image(b, bw))
        elif t == "tool_use" and role == "assistant":
            tid, name = req_str(b, "id", bw), req_str(b, "name", bw)
            inp = b.get("input", {})
            if type(inp) is not dict:
                raise ClientError(f"{bw}.input must be an object")
            names[tid] = name
            calls.append(ToolCall(tid, name, orjson.dumps(inp).decode()))
        elif t == "tool_result" and role == "user":
            tid = req_str(b, "tool_use_id", bw)
            msgs.append(Message("tool", (TextPart(_text_blocks(b.get("content"), f"{bw}.content")),),
                                tool_call_id=tid, name=names.get(tid), is_error=opt_bool(b, "is_error", bw)))
        elif t in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # reasoning traces do not cross protocols
        else:
            raise ClientError(f"{bw}.type {t!r} is not supported in a {role} message")
    if parts or calls:
        msgs.append(Message(role, tuple(parts), tuple(calls)))


def _messages(obj: dict) -> tuple[Message, ...]:
    raw_msgs = obj.get("messages")
    if type(raw_msgs) is not list or not raw_msgs:
        raise ClientError("messages must be a non-empty array")
    check_count(raw_msgs, MAX_MESSAGES, "messages")
    msgs: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> name, so tool results know their function
    for i, m in enumerate(raw_msgs):
        _turn(m, f"messages[{i}]", names, msgs)
    if not msgs:
        raise ClientError("messages carry no content")
    return tuple(msgs)


def _tools(obj: dict) -> tuple[ToolDef, ...]:
    tools = []
    raw_tools = opt_list(obj, "tools", "body")
    check_count(raw_tools, MAX_TOOLS, "tools")
    for j, t in enumerate(raw_tools):
        tw = f"tools[{j}]"
        t = as_object(t, tw)
        if t.get("type", "custom") != "custom":
            raise ClientError(f"{tw}.type {t.get('type')!r}: server tools are not supported")
        schema = t.get("input_schema")
        if type(schema) is not dict:
            raise ClientError(f"{tw}.input_schema must be an object")
        tools.append(ToolDef(req_str(t, "name", tw), opt_str(t, "description", tw), schema))
    return tuple(tools)


def _tool_choice(obj: dict) -> ToolChoice | None:
    tc = obj.get("tool_choice")
    if tc is None:
        return None
    tc = as_object(tc, "tool_choice")
    mode = tc.get("type")
    if mode == "auto" or mode == "none":
        return ToolChoice(mode)
    if mode == "any":
        return ToolChoice("required")
    if mode == "tool":
        return ToolChoice("tool", req_str(tc, "name", "tool_choice"))
    raise ClientError("tool_choice.type must be auto, any, tool or none")


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model", path_model)
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    max_tokens = opt_int(obj, "max_tokens", "body")
    if max_tokens is None:
        raise ClientError("max_tokens is required")
    messages = _messages(obj)
    system = obj.get("system")
    system_text = _text_blocks(system, "system") if system is not None else None
    tools = _tools(obj)
    tool_choice = _tool_choice(obj)
    stop = opt_list(obj, "stop_sequences", "body")
    if not all(type(s) is str for s in stop):
        raise ClientError("stop_sequences must be an array of strings")
    return ChatRequest(
        model=model,
        messages=messages,
        system=system_text,
        tools=tools,
        tool_choice=tool_choice,
        temperature=opt_number(obj, "temperature", "body", 0.0, 1.0),
        top_p=opt_number(obj, "top_p", "body", 0.0, 1.0),
        max_tokens=max_tokens,
        stop=tuple(stop),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        # Anthropic streams always carry usage.
        include_usage=True,
    )


def _user_blocks(content: tuple[ContentPart, ...]) -> list[dict]:
    out: list[dict] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif p.url is not None:
            out.append({"type": "image", "source": {"type": "url", "url": p.url}})
        else:
            out.append({"type": "image", "source": {"type": "base64", "media_type": p.media_type or "image/png",
                                                     "data": p.data}})
    return out


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    """Path and headers of the upstream request, without rendering its body (passthrough)."""
    headers = {"content-type": "application/json", "anthropic-version": API_VERSION}
    if credential:
        headers["x-api-key"] = credential
    return PATH, headers


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None) -> UpstreamRequest:
    msgs: list[dict] = []
    for m in req.messages:
        if m.role == "assistant":
            blocks: list[dict] = [{"type": "text", "text": p.text} for p in m.content if type(p) is TextPart and p.text]
            for tc in m.tool_calls:
                blocks.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": arguments_object(tc.arguments)})
            if blocks:
                msgs.append({"role": "assistant", "content": blocks})
            continue
        if m.role == "tool":
            block: dict = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": message_text(m)}
            if m.is_error:
                block["is_error"] = True
            blocks = [block]
        elif len(m.content) == 1 and type(m.content[0]) is TextPart and not (msgs and msgs[-1]["role"] == "user"):
            msgs.append({"role": "user", "content": m.content[0].text})
            continue
        else:
            blocks = _user_blocks(m.content)
        # Tool results and the user text after them share one user turn, as Anthropic requires.
        if msgs and msgs[-1]["role"] == "user":
            prev = msgs[-1]
            if type(prev["content"]) is str:
                prev["content"] = [{"type": "text", "text": prev["content"]}]
            prev["content"].extend(blocks)
        else:
            msgs.append({"role": "user", "content": blocks})
    body: dict = {"model": upstream_model, "max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS, "messages": msgs}
    if req.system:
        body["system"] = req.system
    if req.tools:
        body["tools"] = [_tool_def(t) for t in req.tools]
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        body["tool_choice"] = (
            {"type": "any"} if mode == "required"
            else {"type": "tool", "name": req.tool_choice.name} if mode == "tool"
            else {"type": mode}
        )
    if req.temperature is not None:
        body["temperature"] = min(req.temperature, 1.0)  # Anthropic's range is 0..1
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.stop:
        body["stop_sequences"] = list(req.stop)
    if req.stream:
        body["stream"] = True
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _tool_def(t: ToolDef) -> dict:
    d: dict = {"name": t.name}
    if t.description is not None:
        d["description"] = t.description
    d["input_schema"] = t.parameters if t.parameters is not None else {"type": "object", "properties": {}}
    return d


# ---- response ------------------------------------------------------------------------------




def _input_tokens(u: dict) -> int:
    # Cached prompt tokens are still prompt tokens for metering.
    return token_count(u.get("input_tokens")) + token_count(u.get("cache_creation_input_tokens")) + token_count(u.get("cache_read_input_tokens"))


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    content = obj.get("content")
    if type(content) is not list:
        raise bad_upstream("content is not an array")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for j, b in enumerate(content):
        if type(b) is not dict:
            raise bad_upstream(f"content[{j}] is not an object")
        t = b.get("type")
        if t == "text" and type(b.get("text")) is str:
            texts.append(b["text"])
        elif t == "tool_use":
            tid, name, inp = b.get("id"), b.get("name"), b.get("input")
            if type(name) is not str:
                raise bad_upstream(f"content[{j}].name missing")
            calls.append(ToolCall(tid if type(tid) is str else f"call_{len(calls)}", name,
                                  orjson.dumps(inp if type(inp) is dict else {}).decode()))
    sr = obj.get("stop_reason")
    reason = _FINISH_IN.get(sr, "stop") if type(sr) is str else ("tool_calls" if calls else "stop")
    u = obj.get("usage")
    usage = Usage(_input_tokens(u), token_count(u.get("output_tokens"))) if type(u) is dict else Usage()
    rid, model = obj.get("id"), obj.get("model")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(texts),
                        tuple(calls), reason, usage)


def render_response(resp: ChatResponse, *, model: str) -> bytes:
    content: list[dict] = []
    if resp.content:
        content.append({"type": "text", "text": resp.content})
    for tc in resp.tool_calls:
        content.append({"type": "tool_use", "id": tc.id, "name": tc.name, "input": arguments_object(tc.arguments)})
    return orjson.dumps({
        "id": resp.id or "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _FINISH_OUT[resp.finish_reason],
        "stop_sequence": None,
        "usage": {"input_tokens": resp.usage.input_tokens, "output_tokens": resp.usage.output_tokens},
    })


# ---- streaming -----------------------------------------------------------------------------


class StreamDecoder(SSEDecoder):
    """Upstream Anthropic SSE bytes -> internal stream events."""

    __slots__ = ("_blocks", "_ntools")

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, int] = {}  # content block index -> tool ordinal (tool_use blocks only)
        self._ntools = 0

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
            elif dt == "input_json_delta":
                pj = d.get("partial_json")
                idx = obj.get("index")
                tool = self._blocks.get(idx) if type(idx) is int else None
                if tool is not None and type(pj) is str and pj:
                    out.append(ToolCallDelta(tool, pj))
        elif t == "content_block_start":
            b = obj.get("content_block")
            if type(b) is not dict:
                return
            if b.get("type") == "text":
                text = b.get("text")
                if type(text) is str and text:
                    out.append(TextDelta(text))
            elif b.get("type") == "tool_use":
                idx, tid, tname = obj.get("index"), b.get("id"), b.get("name")
                n = self._ntools
                self._ntools += 1
                if type(idx) is int:
                    self._blocks[idx] = n
                out.append(ToolCallStart(n, tid if type(tid) is str else f"call_{n}",
                                         tname if type(tname) is str else ""))
                inp = b.get("input")
                if type(inp) is dict and inp:
                    out.append(ToolCallDelta(n, orjson.dumps(inp).decode()))
        elif t == "message_start":
            msg = obj.get("message")
            msg = msg if type(msg) is dict else {}
            u = msg.get("usage")
            if type(u) is dict:
                # Usage first, so an encoder can put input tokens into its own start event.
                out.append(UsageUpdate(_input_tokens(u), token_count(u.get("output_tokens"))))
            rid, model = msg.get("id"), msg.get("model")
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        elif t == "message_delta":
            d = obj.get("delta")
            if type(d) is dict and type(d.get("stop_reason")) is str:
                out.append(StreamFinish(_FINISH_IN.get(d["stop_reason"], "stop")))
            u = obj.get("usage")
            if type(u) is dict:
                inp = _input_tokens(u) if "input_tokens" in u else None
                out.append(UsageUpdate(inp or None, token_count(u.get("output_tokens"))))
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


def _sse_event(obj: dict) -> bytes:
    # Anthropic names every SSE event after its payload's `type`.
    return encode_event(orjson.dumps(obj), obj["type"])


class StreamEncoder:
    """Internal stream events -> Anthropic Messages SSE bytes for the client."""

    __slots__ = ("_model", "_started", "_done", "_in", "_out", "_open", "_next", "_tool_blocks", "_reason")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._started = False
        self._done = False
        self._in = 0
        self._out = 0
        self._open: tuple[Literal["text", "tool"], int] | None = None  # (kind, block index) of the open block
        self._next = 0
        self._tool_blocks: dict[int, int] = {}
        self._reason = "end_turn"

    def _start(self, rid: str, parts: list[bytes]) -> None:
        self._started = True
        parts.append(_sse_event({"type": "message_start", "message": {
            "id": rid or "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": self._model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": self._in, "output_tokens": self._out},
        }}))

    def _close_block(self, parts: list[bytes]) -> None:
        if self._open is not None:
            parts.append(_sse_event({"type": "content_block_stop", "index": self._open[1]}))
            self._open = None

    def _open_block(self, kind: Literal["text", "tool"], block: dict, parts: list[bytes]) -> int:
        self._close_block(parts)
        index = self._next
        self._open = (kind, index)
        self._next += 1
        parts.append(_sse_event({"type": "content_block_start", "index": index, "content_block": block}))
        return index

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
            if isinstance(ev, TextDelta):
                if self._open is not None and self._open[0] == "text":
                    index = self._open[1]
                else:
                    index = self._open_block("text", {"type": "text", "text": ""}, parts)
                parts.append(_sse_event({"type": "content_block_delta", "index": index,
                                         "delta": {"type": "text_delta", "text": ev.text}}))
            elif isinstance(ev, ToolCallStart):
                self._tool_blocks[ev.index] = self._open_block(
                    "tool", {"type": "tool_use", "id": ev.id, "name": ev.name, "input": {}}, parts)
            elif isinstance(ev, ToolCallDelta):
                idx = self._tool_blocks.get(ev.index)
                if idx is not None:
                    parts.append(_sse_event({"type": "content_block_delta", "index": idx,
                                             "delta": {"type": "input_json_delta", "partial_json": ev.arguments}}))
            elif isinstance(ev, StreamFinish):
                self._reason = _FINISH_OUT[ev.reason]
            elif isinstance(ev, StreamEnd):
                self._done = True
                self._close_block(parts)
                parts.append(_sse_event({"type": "message_delta",
                                         "delta": {"stop_reason": self._reason, "stop_sequence": None},
                                         "usage": {"input_tokens": self._in, "output_tokens": self._out}}))
                parts.append(_sse_event({"type": "message_stop"}))
        return b"".join(parts)


# ---- errors and auth -----------------------------------------------------------------------


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": type or default_type(status), "message": message}})


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    key = header(headers, "x-api-key")
    if key:
        return key.strip() or None
    auth = header(headers, "authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None
