"""OpenAI Responses API (POST /v1/responses) <-> internal format, pure functions.

A client protocol like the three chat APIs: `input` items (messages, `function_call`,
`function_call_output`) become internal turns; the answer goes back as a `response` object with
`message` and `function_call` output items, or as the typed SSE events (`response.created`,
`response.output_item.added`, `response.output_text.delta`, ..., `response.completed`).
The gateway stores nothing, so what needs stored state (`previous_response_id`, `conversation`,
`item_reference`) is a 400, as are controls the internal format cannot carry.
"""

from __future__ import annotations

import time
import uuid

import orjson

from adapters import openai
from adapters.call_ids import plain_id, split_signature, with_signature
from adapters.fields import (
    as_object,
    bad_upstream,
    error_message,
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
    DocumentPart,
    FinishReason,
    ImagePart,
    Message,
    RenderOptions,
    ResponseFormat,
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
from adapters.passthrough import with_model
from adapters.sse import SSEDecoder, SSEEvent, encode_event
from modelyard.errors import ClientError

__all__ = [
    "PATH", "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response",
    "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key",
    "check_query", "passthrough_body",
]

PATH = "/v1/responses"
CLIENT_AUTH_HEADERS: tuple[str, ...] = openai.CLIENT_AUTH_HEADERS

# Errors, keys and status codes are OpenAI's own: the Responses API shares them.
render_error = openai.render_error
parse_error = openai.parse_error
client_api_key = openai.client_api_key

_NO_STATE = ("this gateway does not store responses: send the whole conversation in `input` "
             "(and `store: false`)")
# Request keys that need state or features the gateway does not have: a 400 names them.
_UNSUPPORTED = {
    "previous_response_id": _NO_STATE,
    "conversation": _NO_STATE,
    "prompt": "stored prompts are not supported",
    "top_logprobs": "logprobs are not supported",
    "max_tool_calls": "max_tool_calls is not supported",
}
_ROLES = frozenset(("user", "assistant", "system", "developer"))


def _incomplete_reason(reason: FinishReason) -> str | None:
    return {"length": "max_output_tokens", "content_filter": "content_filter"}.get(reason)


# ---- request -------------------------------------------------------------------------------


def _image(p: dict, where: str) -> ImagePart:
    url = p.get("image_url")
    if type(url) is not str or not url:
        raise ClientError(f"{where}.image_url is required (file_id needs stored files, which are not supported)")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or ";base64" not in head:
            raise ClientError(f"{where}.image_url: only base64 data URLs are supported")
        return ImagePart(media_type=head[5:].split(";", 1)[0] or None, data=data)
    return ImagePart(url=url)


def _file(p: dict, where: str) -> DocumentPart:
    if p.get("file_id") is not None:
        raise ClientError(f"{where}.file_id: uploaded files live at OpenAI; send file_data to route anywhere")
    url = p.get("file_data")
    if type(url) is str:
        head, sep, data = url.partition(",")
        if not head.startswith("data:") or not sep or ";base64" not in head:
            raise ClientError(f"{where}.file_data must be a base64 data URL")
        return DocumentPart(head[5:].split(";", 1)[0] or "application/pdf", data=data,
                            name=opt_str(p, "filename", where))
    link = p.get("file_url")
    if type(link) is str and link.split("?", 1)[0].lower().endswith(".pdf"):
        return DocumentPart("application/pdf", url=link, name=opt_str(p, "filename", where))
    raise ClientError(f"{where}: input_file needs file_data (a base64 data URL) or a file_url to a PDF")


def _content(raw: object, where: str, role: str) -> tuple[ContentPart, ...]:
    if type(raw) is str:
        return (TextPart(raw),)
    if type(raw) is not list:
        raise ClientError(f"{where}.content must be a string or an array")
    check_count(raw, MAX_CONTENT_PARTS, f"{where}.content parts")
    parts: list[ContentPart] = []
    for j, p in enumerate(raw):
        pw = f"{where}.content[{j}]"
        p = as_object(p, pw)
        t = p.get("type")
        if t in ("input_text", "output_text", "text"):
            text = p.get("text")
            if type(text) is not str:
                raise ClientError(f"{pw}.text must be a string")
            parts.append(TextPart(text))
        elif t == "refusal" and role == "assistant":
            parts.append(TextPart(req_str(p, "refusal", pw)))
        elif t == "input_image" and role == "user":
            parts.append(_image(p, pw))
        elif t == "input_file" and role == "user":
            parts.append(_file(p, pw))
        else:
            raise ClientError(f"{pw}.type {t!r} is not supported here")
    return tuple(parts)


def _output_text(raw: object, where: str) -> str:
    """A function_call_output's `output`: a string, or text parts joined."""
    if type(raw) is str:
        return raw
    if type(raw) is list:
        return message_text(Message("tool", _content(raw, where, "tool")))
    raise ClientError(f"{where}.output must be a string or an array of text parts")


class _Turns:
    """Input items folded into internal turns: an assistant message and the function calls after
    it are one turn; each function_call_output is a tool turn named after its call."""

    __slots__ = ("system", "msgs", "_names")

    def __init__(self) -> None:
        self.system: list[str] = []
        self.msgs: list[Message] = []
        self._names: dict[str, str] = {}  # call_id -> function name (Gemini pairs results by name)

    def message(self, item: dict, where: str) -> None:
        role = item.get("role")
        if type(role) is not str or role not in _ROLES:
            raise ClientError(f"{where}.role {role!r} is not one of user, assistant, system, developer")
        content = _content(item.get("content"), where, role)
        if role == "system" or role == "developer":
            self.system.append(message_text(Message("user", content)))
        elif role == "user":
            if not content:
                raise ClientError(f"{where}.content is required")
            self.msgs.append(Message("user", content))
        else:
            self.msgs.append(Message("assistant", content))

    def call(self, item: dict, where: str) -> None:
        args = item.get("arguments", "")
        if type(args) is not str:
            raise ClientError(f"{where}.arguments must be a string (JSON text)")
        cid = req_str(item, "call_id", where)
        # A Gemini thought signature rides in the call id (adapters/call_ids.py), as for OpenAI clients.
        call = ToolCall(cid, req_str(item, "name", where), args, split_signature(cid)[1])
        self._names[call.id] = call.name
        last = self.msgs[-1] if self.msgs else None
        if last is not None and last.role == "assistant":
            self.msgs[-1] = Message("assistant", last.content, (*last.tool_calls, call))
        else:
            self.msgs.append(Message("assistant", (), (call,)))

    def output(self, item: dict, where: str) -> None:
        cid = req_str(item, "call_id", where)
        text = _output_text(item.get("output"), where)
        self.msgs.append(Message("tool", (TextPart(text),), tool_call_id=cid, name=self._names.get(cid)))


def _input(obj: dict) -> tuple[str | None, tuple[Message, ...]]:
    raw = obj.get("input")
    instructions = opt_str(obj, "instructions", "body")
    turns = _Turns()
    if instructions:
        turns.system.append(instructions)
    if type(raw) is str:
        turns.msgs.append(Message("user", (TextPart(raw),)))
    elif type(raw) is list and raw:
        check_count(raw, MAX_MESSAGES, "input items")
        for i, item in enumerate(raw):
            where = f"input[{i}]"
            item = as_object(item, where)
            t = item.get("type", "message")
            if t == "message":
                turns.message(item, where)
            elif t == "function_call":
                turns.call(item, where)
            elif t == "function_call_output":
                turns.output(item, where)
            elif t == "item_reference":
                raise ClientError(f"{where}: item_reference needs stored items; {_NO_STATE}")
            else:
                raise ClientError(f"{where}.type {t!r} is not supported (message, function_call, "
                                  "function_call_output)")
    else:
        raise ClientError("input is required: a string or a non-empty array of items")
    if not turns.msgs:
        raise ClientError("input must contain at least one user, assistant or function_call_output item")
    return ("\n\n".join(turns.system) if turns.system else None), tuple(turns.msgs)


def _tools(obj: dict) -> tuple[ToolDef, ...]:
    raw = opt_list(obj, "tools", "body")
    check_count(raw, MAX_TOOLS, "tools")
    out = []
    for j, t in enumerate(raw):
        tw = f"tools[{j}]"
        t = as_object(t, tw)
        if t.get("type") != "function":
            raise ClientError(f"{tw}.type {t.get('type')!r} is not supported: only function tools are")
        params = t.get("parameters")
        if params is not None and type(params) is not dict:
            raise ClientError(f"{tw}.parameters must be an object")
        out.append(ToolDef(req_str(t, "name", tw), opt_str(t, "description", tw), params))
    return tuple(out)


def _tool_choice(obj: dict) -> ToolChoice | None:
    raw = obj.get("tool_choice")
    if raw is None:
        return None
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    if type(raw) is dict and raw.get("type") == "function":
        return ToolChoice("tool", req_str(raw, "name", "tool_choice"))
    raise ClientError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def _refuse_unsupported(obj: dict) -> None:
    """What the internal format cannot carry is a clear 400, never silently dropped."""
    for key, why in _UNSUPPORTED.items():
        if obj.get(key) is not None:
            raise ClientError(f"{key} is not supported: {why}")
    if obj.get("background"):
        raise ClientError("background is not supported: responses are answered in the request")
    reasoning = obj.get("reasoning")
    if reasoning is not None and (type(reasoning) is not dict or any(v is not None for v in reasoning.values())):
        raise ClientError("reasoning options are not supported by this gateway")


def _response_format(obj: dict) -> ResponseFormat | None:
    """`text.format`: Responses puts the json_schema fields flat (name, schema, strict)."""
    text = obj.get("text")
    if text is None:
        return None
    fmt = as_object(text, "text").get("format")
    if fmt is None:
        return None
    fmt = as_object(fmt, "text.format")
    t = fmt.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return ResponseFormat("json_object")
    if t == "json_schema":
        schema = fmt.get("schema")
        if type(schema) is not dict:
            raise ClientError("text.format.schema must be an object")
        strict = fmt.get("strict")
        return ResponseFormat("json_schema", schema, opt_str(fmt, "name", "text.format"),
                              strict if type(strict) is bool else None)
    raise ClientError("text.format.type must be text, json_object or json_schema")


def _text_config(rf: ResponseFormat | None) -> dict:
    if rf is None:
        return {"format": {"type": "text"}}
    if rf.type == "json_object":
        return {"format": {"type": "json_object"}}
    fmt: dict = {"type": "json_schema", "name": rf.name or "response",
                 "schema": rf.schema if rf.schema is not None else {"type": "object"}}
    if rf.strict is not None:
        fmt["strict"] = rf.strict
    return {"format": fmt}


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model", path_model)
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    _refuse_unsupported(obj)
    system, messages = _input(obj)
    return ChatRequest(
        model=model,
        messages=messages,
        system=system,
        tools=_tools(obj),
        tool_choice=_tool_choice(obj),
        temperature=opt_number(obj, "temperature", "body", 0.0, 2.0),
        top_p=opt_number(obj, "top_p", "body", 0.0, 1.0),
        max_tokens=opt_int(obj, "max_output_tokens", "body"),
        parallel_tool_calls=_parallel_tool_calls(obj),
        response_format=_response_format(obj),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
    )


def _parallel_tool_calls(obj: dict) -> bool | None:
    v = obj.get("parallel_tool_calls")
    if v is not None and type(v) is not bool:
        raise ClientError("parallel_tool_calls must be a boolean")
    return v


def _input_items(req: ChatRequest) -> list[dict]:
    items: list[dict] = []
    for m in req.messages:
        if m.role == "tool":
            items.append({"type": "function_call_output", "call_id": plain_id(m.tool_call_id or ""),
                          "output": message_text(m)})
            continue
        if m.content:
            kind = "input_text" if m.role == "user" else "output_text"
            parts: list[dict] = []
            for p in m.content:
                if isinstance(p, TextPart):
                    parts.append({"type": kind, "text": p.text})
                elif isinstance(p, DocumentPart):
                    parts.append(_file_part(p))
                else:
                    url = p.url if p.url is not None else f"data:{p.media_type or 'image/png'};base64,{p.data}"
                    parts.append({"type": "input_image", "image_url": url})
            items.append({"type": "message", "role": m.role, "content": parts})
        for tc in m.tool_calls:
            items.append({"type": "function_call", "call_id": plain_id(tc.id), "name": tc.name,
                          "arguments": tc.arguments or "{}"})
    return items


def _file_part(p: DocumentPart) -> dict:
    d: dict = {"type": "input_file"}
    if p.data is not None:
        d["file_data"] = f"data:{p.media_type};base64,{p.data}"
    else:
        d["file_url"] = p.url
    if p.name:
        d["filename"] = p.name
    return d


def _tool_defs(tools: tuple[ToolDef, ...]) -> list[dict]:
    out = []
    for t in tools:
        d: dict = {"type": "function", "name": t.name,
                   "parameters": t.parameters if t.parameters is not None else {"type": "object", "properties": {}}}
        if t.description is not None:
            d["description"] = t.description
        out.append(d)
    return out


def _tool_choice_out(tc: ToolChoice | None) -> str | dict:
    if tc is None:
        return "auto"
    return {"type": "function", "name": tc.name} if tc.mode == "tool" else tc.mode


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return PATH, headers


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    body: dict = {"model": upstream_model, "input": _input_items(req), "store": False}
    if req.system is not None:
        body["instructions"] = req.system
    if req.tools:
        body["tools"] = _tool_defs(req.tools)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice_out(req.tool_choice)
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.max_tokens is not None:
        body["max_output_tokens"] = req.max_tokens
    if req.top_k is not None:
        raise ClientError("top_k cannot be sent to a Responses API upstream (it has no such control)")
    if req.parallel_tool_calls is not None and req.tools:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.response_format is not None:
        body["text"] = _text_config(req.response_format)
    if req.stream:
        body["stream"] = True
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


# ---- response ------------------------------------------------------------------------------


def _usage(u: Usage) -> dict:
    return {"input_tokens": u.input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": u.output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u.total_tokens}


def _part(kind: str, text: str) -> dict:
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, parts: list[dict], status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def _call_item(item_id: str, tc: ToolCall, status: str) -> dict:
    # A Gemini thought signature rides in the call id; a call without arguments is "{}", as OpenAI sends it.
    return {"type": "function_call", "id": item_id, "call_id": with_signature(tc.id, tc.signature),
            "name": tc.name, "arguments": tc.arguments or "{}", "status": status}


def _response_object(rid: str, created: int, model: str, output: list[dict], status: str,
                     reason: FinishReason | None, usage: Usage | None, req: ChatRequest | None,
                     error: str | None = None) -> dict:
    """The `response` object, as answered whole and as carried by the stream's lifecycle events."""
    incomplete = _incomplete_reason(reason) if reason is not None and status == "incomplete" else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "error": {"code": "server_error", "message": error} if error is not None else None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.system if req else None,
        "max_output_tokens": req.max_tokens if req else None,
        "model": model, "output": output, "previous_response_id": None,
        "parallel_tool_calls": req.parallel_tool_calls is not False if req else True,
        "reasoning": {"effort": None, "summary": None}, "store": False,
        "temperature": req.temperature if req else None,
        "text": _text_config(req.response_format if req else None),
        "tool_choice": _tool_choice_out(req.tool_choice if req else None),
        "tools": _tool_defs(req.tools) if req else [],
        "top_p": req.top_p if req else None, "truncation": "disabled",
        "usage": _usage(usage) if usage is not None else None, "user": None, "metadata": {},
    }


def _status(reason: FinishReason, refused: bool = False) -> str:
    if reason == "error":
        return "failed"
    if refused and reason == "content_filter":
        return "completed"  # OpenAI answers a refusal as a completed response with a refusal part
    return "incomplete" if _incomplete_reason(reason) else "completed"


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    status = _status(resp.finish_reason, resp.refusal is not None)
    item_status = "incomplete" if status == "incomplete" else "completed"
    # One random draw per response; item ids add their output index (unique, and cheap).
    base = uuid.uuid4().hex
    output: list[dict] = []
    if resp.content or resp.refusal or not resp.tool_calls:
        parts = [_part("output_text", resp.content)] if resp.content or not resp.refusal else []
        if resp.refusal:
            parts.append(_part("refusal", resp.refusal))
        output.append(_message_item(f"msg_{base}_0", parts, item_status))
    for tc in resp.tool_calls:
        output.append(_call_item(f"fc_{base}_{len(output)}", tc, item_status))
    error = "the model stopped with an error" if status == "failed" else None
    return orjson.dumps(_response_object("resp_" + base, int(time.time()), model, output, status,
                                         resp.finish_reason, resp.usage, request, error))


def _reason_of(obj: dict, has_calls: bool) -> FinishReason:
    status = obj.get("status")
    if status == "failed":
        return "error"
    if status == "incomplete":
        details = obj.get("incomplete_details")
        why = details.get("reason") if type(details) is dict else None
        return "content_filter" if why == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


def _read_usage(raw: object) -> Usage:
    if type(raw) is not dict:
        return Usage()
    return Usage(token_count(raw.get("input_tokens")), token_count(raw.get("output_tokens")))


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    output = obj.get("output")
    if type(output) is not list:
        raise bad_upstream("no output")
    text: list[str] = []
    refusal: list[str] = []
    calls: list[ToolCall] = []
    for j, item in enumerate(output):
        if type(item) is not dict:
            raise bad_upstream(f"output[{j}] is not an object")
        if item.get("type") == "message":
            for c in item.get("content") or ():
                if type(c) is dict and c.get("type") == "output_text" and type(c.get("text")) is str:
                    text.append(c["text"])
                elif type(c) is dict and c.get("type") == "refusal" and type(c.get("refusal")) is str:
                    refusal.append(c["refusal"])
        elif item.get("type") == "function_call":
            cid, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if type(cid) is not str or type(name) is not str:
                raise bad_upstream(f"output[{j}] function_call malformed")
            calls.append(ToolCall(cid, name, args if type(args) is str else ""))
    rid, model = obj.get("id"), obj.get("model")
    reason = _reason_of(obj, bool(calls))
    if refusal and reason == "stop":
        reason = "content_filter"  # a refusal ends the turn as a refusal, as the OpenAI adapter reads it
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(text),
                        tuple(calls), reason, _read_usage(obj.get("usage")), "".join(refusal) or None)


# ---- streaming -----------------------------------------------------------------------------


class StreamDecoder(SSEDecoder):
    """Upstream Responses SSE (typed events) -> internal stream events."""

    __slots__ = ("_started", "_calls")

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._calls: dict[str, int] = {}  # function_call item id -> tool ordinal

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
            rid, model = resp.get("id"), resp.get("model")
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        elif t == "response.output_text.delta" and type(obj.get("delta")) is str and obj["delta"]:
            out.append(TextDelta(obj["delta"]))
        elif t == "response.refusal.delta" and type(obj.get("delta")) is str and obj["delta"]:
            out.append(TextDelta(obj["delta"], refusal=True))
        elif t == "response.output_item.added":
            item = obj.get("item")
            if type(item) is dict and item.get("type") == "function_call":
                n = len(self._calls)
                self._calls[str(item.get("id"))] = n
                cid, name = item.get("call_id"), item.get("name")
                out.append(ToolCallStart(n, cid if type(cid) is str else f"call_{n}", name if type(name) is str else ""))
        elif t == "response.function_call_arguments.delta":
            idx = self._calls.get(str(obj.get("item_id")))
            if idx is not None and type(obj.get("delta")) is str and obj["delta"]:
                out.append(ToolCallDelta(idx, obj["delta"]))
        elif t in ("response.completed", "response.incomplete", "response.failed") and type(resp) is dict:
            self._done = True
            if t == "response.failed":
                err = resp.get("error")
                msg = err.get("message") if type(err) is dict else None
                out.append(StreamError(msg if type(msg) is str else "upstream response failed", "api_error"))
                return
            u = _read_usage(resp.get("usage"))
            out += [StreamFinish(_reason_of(resp, bool(self._calls))), UsageUpdate(u.input_tokens, u.output_tokens),
                    StreamEnd()]

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before response.completed", "api_error")


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
                 "_text_index", "_text_id", "_parts", "_kind", "_text", "_calls", "_in", "_out", "_reason",
                 "_refused")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._request = request
        self._base = uuid.uuid4().hex  # one random draw per stream; item ids add their output index
        self._id = "resp_" + self._base
        self._created = int(time.time())
        self._seq = 0
        self._started = False
        self._done = False
        self._output: list[dict] = []  # finished output items, by output_index
        self._text_index: int | None = None  # output_index of the open message item
        self._text_id = ""
        self._parts: list[dict] = []  # the open message's finished content parts
        self._kind = ""  # the open part's kind: output_text or refusal
        self._text: list[str] = []  # the open part's text so far
        self._calls: dict[int, _OpenCall] = {}  # tool ordinal -> open function_call item
        self._in = 0
        self._out = 0
        self._reason: FinishReason | None = None
        self._refused = False  # a refusal part streamed

    def _emit(self, parts: list[bytes], kind: str, payload: dict) -> None:
        payload = {"type": kind, "sequence_number": self._seq, **payload}
        self._seq += 1
        parts.append(encode_event(orjson.dumps(payload), kind))

    def _snapshot(self, status: str, error: str | None = None) -> dict:
        usage = Usage(self._in, self._out) if status != "in_progress" else None
        output = [i for i in self._output if i]  # items still open are not in the snapshot
        return _response_object(self._id, self._created, self._model, output, status, self._reason, usage,
                                self._request, error)

    def _start(self, parts: list[bytes]) -> None:
        self._started = True
        self._emit(parts, "response.created", {"response": self._snapshot("in_progress")})
        self._emit(parts, "response.in_progress", {"response": self._snapshot("in_progress")})

    def _slot(self) -> int:
        self._output.append({})  # placeholder until the item is done
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

    def _close_all(self, parts: list[bytes]) -> None:
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
                continue
            if not self._started:
                self._start(parts)
            if isinstance(ev, StreamStart):
                continue
            if isinstance(ev, TextDelta):
                if ev.text:
                    self._refused = self._refused or ev.refusal
                    self._text_delta(ev.text, "refusal" if ev.refusal else "output_text", parts)
            elif isinstance(ev, ToolCallStart):
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


# -- the request as the client sent it -----------------------------------------------------------
check_query = openai.check_query


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for a Responses upstream: its streams report usage unasked."""
    return with_model(body, req, upstream_model), False
