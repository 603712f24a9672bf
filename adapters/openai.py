"""OpenAI Chat Completions <-> internal format (POST /v1/chat/completions), pure functions."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

import orjson

from adapters.call_ids import plain_id, split_signature, with_signature
from adapters.fields import (
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
from modelyard.errors import ClientError, default_type

__all__ = [
    "PATH", "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response",
    "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error",
    "client_api_key", "check_query", "passthrough_body",
]

PATH = "/v1/chat/completions"
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("authorization",)

_FINISH_IN: dict[str, FinishReason] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls", "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "stop", "length": "length", "tool_calls": "tool_calls",
    "content_filter": "content_filter", "error": "stop",
}
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))


# ---- request -------------------------------------------------------------------------------


def _image(part: dict, where: str) -> ImagePart:
    iu = part.get("image_url")
    url = iu if type(iu) is str else req_str(as_object(iu, f"{where}.image_url"), "url", f"{where}.image_url")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or ";base64" not in head:
            raise ClientError(f"{where}.image_url.url: only base64 data URLs are supported")
        return ImagePart(media_type=head[5:].split(";", 1)[0] or None, data=data)
    return ImagePart(url=url)


def _file(part: dict, where: str) -> DocumentPart:
    f = as_object(part.get("file"), f"{where}.file")
    if f.get("file_id") is not None:
        raise ClientError(f"{where}.file.file_id: uploaded files live at OpenAI; send file_data to route anywhere")
    url = req_str(f, "file_data", f"{where}.file")
    head, sep, data = url.partition(",")
    if not head.startswith("data:") or not sep or ";base64" not in head:
        raise ClientError(f"{where}.file.file_data must be a base64 data URL")
    return DocumentPart(head[5:].split(";", 1)[0] or "application/pdf", data=data,
                        name=opt_str(f, "filename", f"{where}.file"))


def _content(raw: object, where: str, allow_images: bool) -> tuple[ContentPart, ...]:
    if raw is None:
        return ()
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
        if t == "text":
            text = p.get("text")
            if type(text) is not str:
                raise ClientError(f"{pw}.text must be a string")
            parts.append(TextPart(text))
        elif t == "image_url" and allow_images:
            parts.append(_image(p, pw))
        elif t == "file" and allow_images:
            parts.append(_file(p, pw))
        else:
            raise ClientError(f"{pw}.type {t!r} is not supported here")
    return tuple(parts)


def _tool_calls(raw: list, where: str) -> tuple[ToolCall, ...]:
    out = []
    for j, tc in enumerate(raw):
        tw = f"{where}.tool_calls[{j}]"
        tc = as_object(tc, tw)
        fn = as_object(tc.get("function"), f"{tw}.function")
        args = fn.get("arguments", "")
        if type(args) is not str:
            raise ClientError(f"{tw}.function.arguments must be a string")
        tid = req_str(tc, "id", tw)
        out.append(ToolCall(id=tid, name=req_str(fn, "name", f"{tw}.function"), arguments=args,
                            signature=split_signature(tid)[1]))
    return tuple(out)


def _message(m: object, where: str) -> Message | str:
    """One turn in the general shape; a system or developer turn comes back as its text."""
    m = as_object(m, where)
    role = m.get("role")
    if type(role) is not str or role not in _ROLES:
        raise ClientError(f"{where}.role {role!r} is not one of system, developer, user, assistant, tool")
    if role == "system" or role == "developer":
        # Without images allowed every part is text.
        return "".join(p.text for p in _content(m.get("content"), where, False) if isinstance(p, TextPart))
    if role == "user":
        content = _content(m.get("content"), where, True)
        if not content:
            raise ClientError(f"{where}.content is required")
        return Message("user", content)
    if role == "assistant":
        tcs = _tool_calls(opt_list(m, "tool_calls", where), where)
        content = _content(m.get("content"), where, False)
        if not content and not tcs:
            raise ClientError(f"{where} needs content or tool_calls")
        return Message("assistant", content, tcs)
    return Message("tool", _content(m.get("content"), where, False),
                   tool_call_id=req_str(m, "tool_call_id", where), name=opt_str(m, "name", where))


def _messages(obj: dict) -> tuple[str | None, tuple[Message, ...]]:
    """(system prompt, turns): every target has one system prompt, so system turns are hoisted and joined."""
    raw_msgs = obj.get("messages")
    if type(raw_msgs) is not list or not raw_msgs:
        raise ClientError("messages must be a non-empty array")
    check_count(raw_msgs, MAX_MESSAGES, "messages")
    system: list[str] = []
    msgs: list[Message] = []
    for i, m in enumerate(raw_msgs):
        if type(m) is dict:
            role, c = m.get("role"), m.get("content")
            # Fast path for the common shape: a user or assistant turn with plain string content.
            if type(c) is str and (role == "user" or (role == "assistant" and not m.get("tool_calls"))):
                msgs.append(Message(role, (TextPart(c),)))
                continue
        turn = _message(m, f"messages[{i}]")
        if isinstance(turn, str):
            system.append(turn)
        else:
            msgs.append(turn)
    if not msgs:
        raise ClientError("messages must contain at least one user, assistant or tool message")
    return ("\n\n".join(system) if system else None), tuple(msgs)


def _tools(obj: dict) -> tuple[ToolDef, ...]:
    tools = []
    raw_tools = opt_list(obj, "tools", "body")
    check_count(raw_tools, MAX_TOOLS, "tools")
    for j, t in enumerate(raw_tools):
        tw = f"tools[{j}]"
        t = as_object(t, tw)
        if t.get("type", "function") != "function":
            raise ClientError(f"{tw}.type must be 'function'")
        fn = as_object(t.get("function"), f"{tw}.function")
        params = fn.get("parameters")
        if params is not None and type(params) is not dict:
            raise ClientError(f"{tw}.function.parameters must be an object")
        tools.append(ToolDef(req_str(fn, "name", f"{tw}.function"), opt_str(fn, "description", tw), params))
    return tuple(tools)


def _tool_choice(obj: dict) -> ToolChoice | None:
    tc_raw = obj.get("tool_choice")
    if tc_raw is None:
        return None
    if tc_raw == "auto" or tc_raw == "none" or tc_raw == "required":
        return ToolChoice(tc_raw)
    if type(tc_raw) is dict:
        fn = as_object(tc_raw.get("function"), "tool_choice.function")
        return ToolChoice("tool", req_str(fn, "name", "tool_choice.function"))
    raise ClientError("tool_choice must be 'auto', 'none', 'required' or a function object")


def _stop(obj: dict) -> tuple[str, ...]:
    stop_raw = obj.get("stop")
    if stop_raw is None:
        return ()
    if type(stop_raw) is str:
        return (stop_raw,)
    if type(stop_raw) is list and all(type(s) is str for s in stop_raw):
        return tuple(stop_raw)
    raise ClientError("stop must be a string or an array of strings")


def _max_tokens(obj: dict) -> int | None:
    n = opt_int(obj, "n", "body")
    if n is not None and n != 1:
        raise ClientError("n other than 1 is not supported")
    max_tokens = opt_int(obj, "max_completion_tokens", "body")
    return opt_int(obj, "max_tokens", "body") if max_tokens is None else max_tokens


def _response_format(obj: dict) -> ResponseFormat | None:
    rf = obj.get("response_format")
    if rf is None:
        return None
    rf = as_object(rf, "response_format")
    t = rf.get("type")
    if t == "text":
        return None
    if t == "json_object":
        return ResponseFormat("json_object")
    if t == "json_schema":
        js = as_object(rf.get("json_schema"), "response_format.json_schema")
        schema = js.get("schema")
        if schema is not None and type(schema) is not dict:
            raise ClientError("response_format.json_schema.schema must be an object")
        strict = js.get("strict")
        return ResponseFormat("json_schema", schema, opt_str(js, "name", "response_format.json_schema"),
                              strict if type(strict) is bool else None)
    raise ClientError("response_format.type must be text, json_object or json_schema")


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model", path_model)
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    system, messages = _messages(obj)
    tools = _tools(obj)
    tool_choice = _tool_choice(obj)
    stop = _stop(obj)
    max_tokens = _max_tokens(obj)
    so = obj.get("stream_options")
    include_usage = opt_bool(as_object(so, "stream_options"), "include_usage", "stream_options") if so is not None else False
    ptc = obj.get("parallel_tool_calls")
    if ptc is not None and type(ptc) is not bool:
        raise ClientError("parallel_tool_calls must be a boolean")
    return ChatRequest(
        model=model,
        messages=messages,
        system=system,
        tools=tools,
        tool_choice=tool_choice,
        temperature=opt_number(obj, "temperature", "body", 0.0, 2.0),
        top_p=opt_number(obj, "top_p", "body", 0.0, 1.0),
        max_tokens=max_tokens,
        stop=stop,
        # Not OpenAI's, but OpenAI-compatible servers (vLLM, llama.cpp) take it.
        top_k=opt_int(obj, "top_k", "body"),
        parallel_tool_calls=ptc,
        response_format=_response_format(obj),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        include_usage=include_usage,
    )


def _render_content(content: tuple[ContentPart, ...]) -> str | list:
    if len(content) == 1 and type(content[0]) is TextPart:
        return content[0].text
    out: list[dict] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, DocumentPart):
            out.append(_file_part(p))
        else:
            url = p.url if p.url is not None else f"data:{p.media_type or 'image/png'};base64,{p.data}"
            out.append({"type": "image_url", "image_url": {"url": url}})
    return out


def _file_part(p: DocumentPart) -> dict:
    # Chat Completions takes PDFs, inline only; anything else has no place there.
    if p.media_type != "application/pdf" or p.data is None:
        what = p.media_type if p.data is not None else f"{p.media_type} by URL"
        raise ClientError(f"a {what} document cannot be sent to an OpenAI Chat Completions deployment")
    return {"type": "file", "file": {"filename": p.name or "document.pdf",
                                     "file_data": f"data:{p.media_type};base64,{p.data}"}}


def _tool_result_text(m: Message) -> str:
    if any(type(p) is not TextPart for p in m.content):
        raise ClientError("a tool result with images or files cannot be sent to an OpenAI Chat Completions "
                          "deployment (its tool messages carry text only)")
    return message_text(m)


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    """Path and headers of the upstream request, without rendering its body (passthrough)."""
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return PATH, headers


def _call(tc: ToolCall, call_id: str) -> dict:
    # A call without arguments is "{}" on every path, as OpenAI itself sends it.
    return {"id": call_id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments or "{}"}}


def _render_response_format(rf: ResponseFormat) -> dict:
    if rf.type == "json_object":
        return {"type": "json_object"}
    js: dict = {"name": rf.name or "response", "schema": rf.schema if rf.schema is not None else {"type": "object"}}
    if rf.strict is not None:
        js["strict"] = rf.strict
    return {"type": "json_schema", "json_schema": js}


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    if req.top_k is not None:
        raise ClientError("top_k is not supported by this model's OpenAI deployment")
    msgs: list[dict] = []
    if req.system is not None:
        msgs.append({"role": "system", "content": req.system})
    for m in req.messages:
        if m.role == "user":
            msgs.append({"role": "user", "content": _render_content(m.content)})
        elif m.role == "assistant":
            d: dict = {"role": "assistant", "content": message_text(m) if m.content else None}
            if m.tool_calls:
                d["tool_calls"] = [_call(tc, plain_id(tc.id)) for tc in m.tool_calls]
            msgs.append(d)
        else:
            msgs.append({"role": "tool", "tool_call_id": plain_id(m.tool_call_id or ""),
                         "content": _tool_result_text(m)})
    body: dict = {"model": upstream_model, "messages": msgs}
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": _tool_def(t)} for t in req.tools
        ]
    if req.tool_choice is not None:
        tc = req.tool_choice
        body["tool_choice"] = tc.mode if tc.mode != "tool" else {"type": "function", "function": {"name": tc.name}}
    if req.parallel_tool_calls is not None and req.tools:  # OpenAI refuses the flag without tools
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.response_format is not None:
        body["response_format"] = _render_response_format(req.response_format)
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.max_tokens is not None:
        legacy = options is not None and options.legacy_max_tokens
        body["max_tokens" if legacy else "max_completion_tokens"] = req.max_tokens
    if req.stop:
        body["stop"] = list(req.stop)
    if req.stream:
        # Always ask for usage: the gateway meters it even when the client did not ask for it.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _tool_def(t: ToolDef) -> dict:
    d: dict = {"name": t.name}
    if t.description is not None:
        d["description"] = t.description
    d["parameters"] = t.parameters if t.parameters is not None else {"type": "object", "properties": {}}
    return d


# ---- response ------------------------------------------------------------------------------



def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    choices = obj.get("choices")
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        raise bad_upstream("no choices")
    msg = choices[0].get("message")
    if type(msg) is not dict:
        raise bad_upstream("choices[0].message missing")
    content = msg.get("content")
    if type(content) is list:  # some servers answer with parts
        content = "".join(p.get("text", "") for p in content if type(p) is dict and type(p.get("text")) is str)
    elif type(content) is not str:
        content = ""
    refusal = msg.get("refusal")
    refusal = refusal if type(refusal) is str and refusal else None
    tcs = []
    raw_tcs = msg.get("tool_calls")
    if type(raw_tcs) is list:
        for j, tc in enumerate(raw_tcs):
            fn = tc.get("function") if type(tc) is dict else None
            if type(fn) is not dict or type(fn.get("name")) is not str:
                raise bad_upstream(f"tool_calls[{j}] malformed")
            args = fn.get("arguments")
            tid = tc.get("id")
            tcs.append(ToolCall(tid if type(tid) is str else f"call_{j}", fn["name"], args if type(args) is str else ""))
    fr = choices[0].get("finish_reason")
    reason = _FINISH_IN.get(fr, "stop") if type(fr) is str else ("tool_calls" if tcs else "stop")
    if refusal is not None and reason == "stop":
        reason = "content_filter"  # a refusal ends the turn as a refusal, not an answer
    usage = obj.get("usage")
    u = Usage()
    if type(usage) is dict:
        u = Usage(token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")))
    rid, model = obj.get("id"), obj.get("model")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", content,
                        tuple(tcs), reason, u, refusal)



def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    empty = not resp.content and (resp.tool_calls or resp.refusal)
    msg: dict = {"role": "assistant", "content": None if empty else resp.content, "refusal": resp.refusal}
    if resp.tool_calls:
        # A Gemini thought signature rides in the id, which the client hands back next turn.
        msg["tool_calls"] = [_call(tc, with_signature(tc.id, tc.signature)) for tc in resp.tool_calls]
    u = resp.usage
    return orjson.dumps({
        "id": resp.id or "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": msg, "finish_reason": _FINISH_OUT[resp.finish_reason], "logprobs": None}],
        "usage": {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens, "total_tokens": u.total_tokens},
    })


# ---- streaming -----------------------------------------------------------------------------


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
        data = ev.data
        if data == b"[DONE]":
            self._done = True
            out.append(StreamEnd())
            return
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is not dict:
            self._done = True
            out.append(StreamError("upstream sent a malformed stream chunk", "api_error"))
            return
        if "error" in obj:
            self._done = True
            out.append(StreamError(error_message(data, 500), "api_error"))
            return
        if not self._started:
            self._started = True
            rid, model = obj.get("id"), obj.get("model")
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        choices = obj.get("choices")
        if type(choices) is list and choices and type(choices[0]) is dict:
            ch = choices[0]
            delta = ch.get("delta")
            if type(delta) is dict:
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
            out.append(UsageUpdate(token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens"))))

    def _cut(self) -> StreamEvent:
        return StreamError("upstream stream ended before [DONE]", "api_error")


class StreamEncoder:
    """Internal stream events -> OpenAI chat.completion.chunk SSE bytes for the client."""

    __slots__ = ("_model", "_include_usage", "_id", "_created", "_started", "_done", "_in", "_out", "_no_args")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._include_usage = bool(request and request.include_usage)
        self._id = ""
        self._created = int(time.time())
        self._started = False
        self._done = False
        self._in = 0
        self._out = 0
        self._no_args: set[int] = set()  # tool calls that have streamed no argument text yet

    def _chunk(self, delta: dict, finish: str | None = None) -> bytes:
        return encode_event(orjson.dumps({
            "id": self._id, "object": "chat.completion.chunk", "created": self._created, "model": self._model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }))

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
                continue
            if isinstance(ev, StreamError):
                self._done = True
                parts.append(encode_event(render_error(500, ev.message, ev.type)))
                continue
            if not self._started:
                self._start("", parts)
            if isinstance(ev, TextDelta):
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
                    parts.append(encode_event(orjson.dumps({
                        "id": self._id, "object": "chat.completion.chunk", "created": self._created,
                        "model": self._model, "choices": [],
                        "usage": {"prompt_tokens": self._in, "completion_tokens": self._out,
                                  "total_tokens": self._in + self._out},
                    })))
                parts.append(b"data: [DONE]\n\n")
        return b"".join(parts)

    def _close_empty_calls(self, parts: list[bytes]) -> None:
        # A call without arguments ends as "{}" (JSON), as a non-streamed answer gives it.
        for index in sorted(self._no_args):
            parts.append(self._chunk({"tool_calls": [{"index": index, "function": {"arguments": "{}"}}]}))
        self._no_args.clear()


# ---- errors and auth -----------------------------------------------------------------------

_OPENAI_TYPES = {"api_error": "server_error", "overloaded_error": "server_error", "timeout_error": "server_error"}
_OPENAI_CODES = {401: "invalid_api_key", 404: "model_not_found", 429: "rate_limit_exceeded"}


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    t = type or default_type(status)
    return orjson.dumps({"error": {
        "message": message, "type": _OPENAI_TYPES.get(t, t), "param": None, "code": _OPENAI_CODES.get(status),
    }})


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    auth = header(headers, "authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


# -- the request as the client sent it -----------------------------------------------------------
def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Nothing in the query string changes an OpenAI request."""


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for an OpenAI upstream; a stream gets usage switched on (True) so it
    can be metered, and the usage chunk the client did not ask for is stripped on the way back."""
    inject = req.stream and not req.include_usage
    return with_model(body, req, upstream_model, include_usage=inject), inject
