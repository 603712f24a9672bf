"""Anthropic Messages <-> internal format (POST /v1/messages), pure functions."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import uuid
from collections.abc import Mapping

import orjson

from adapters.call_ids import plain_id, split_signature, with_signature
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
    upstream_error,
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
from modelyard.errors import ClientError, ModelyardError, default_type

__all__ = [
    "PATH", "API_VERSION", "DEFAULT_MAX_TOKENS", "CLIENT_AUTH_HEADERS", "parse_request",
    "request_target", "render_request", "parse_response", "render_response", "StreamDecoder", "StreamEncoder",
    "render_error", "parse_error", "client_api_key", "check_query", "passthrough_body",
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
# Anthropic's documented tool_use id pattern; other protocols' ids (`functions.f:0`) may not match.
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
# Structured output to Anthropic is a forced tool of this name; its input comes back as the text.
JSON_TOOL = "modelyard_json_response"
_DOCUMENT_TYPES = frozenset(("application/pdf", "text/plain"))


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


def _document(block: dict, where: str) -> DocumentPart:
    src = as_object(block.get("source"), f"{where}.source")
    st = src.get("type")
    title = opt_str(block, "title", where)
    if st == "base64":
        return DocumentPart(opt_str(src, "media_type", f"{where}.source") or "application/pdf",
                            data=req_str(src, "data", f"{where}.source"), name=title)
    if st == "url":
        return DocumentPart("application/pdf", url=req_str(src, "url", f"{where}.source"), name=title)
    if st == "text":
        text = req_str(src, "data", f"{where}.source")
        return DocumentPart("text/plain", data=base64.b64encode(text.encode()).decode(), name=title)
    raise ClientError(f"{where}.source.type {st!r} is not supported")


def _result_parts(raw: object, where: str) -> tuple[ContentPart, ...]:
    """tool_result content: a string or text, image and document blocks, all kept."""
    if raw is None:
        return (TextPart(""),)
    if type(raw) is str:
        return (TextPart(raw),)
    if type(raw) is not list:
        raise ClientError(f"{where} must be a string or an array of blocks")
    check_count(raw, MAX_CONTENT_PARTS, f"{where} blocks")
    parts: list[ContentPart] = []
    for j, b in enumerate(raw):
        bw = f"{where}[{j}]"
        b = as_object(b, bw)
        t = b.get("type")
        if t == "text":
            text = b.get("text")
            if type(text) is not str:
                raise ClientError(f"{bw}.text must be a string")
            parts.append(TextPart(text))
        elif t == "image":
            parts.append(_image(b, bw))
        elif t == "document":
            parts.append(_document(b, bw))
        else:
            raise ClientError(f"{bw}.type {t!r} is not supported")
    return tuple(parts) or (TextPart(""),)


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
        elif t == "document" and role == "user":
            parts.append(_document(b, bw))
        elif t == "tool_use" and role == "assistant":
            tid, name = req_str(b, "id", bw), req_str(b, "name", bw)
            inp = b.get("input", {})
            if type(inp) is not dict:
                raise ClientError(f"{bw}.input must be an object")
            names[tid] = name
            calls.append(ToolCall(tid, name, orjson.dumps(inp).decode(), split_signature(tid)[1]))
        elif t == "tool_result" and role == "user":
            tid = req_str(b, "tool_use_id", bw)
            msgs.append(Message("tool", _result_parts(b.get("content"), f"{bw}.content"),
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


def _parallel(obj: dict) -> bool | None:
    tc = obj.get("tool_choice")
    if type(tc) is dict and opt_bool(tc, "disable_parallel_tool_use", "tool_choice"):
        return False
    return None


def _output_format(obj: dict) -> ResponseFormat | None:
    # Structured outputs: `output_format` (beta) or `output_config.format`.
    oc = obj.get("output_config")
    fmt = as_object(oc, "output_config").get("format") if oc is not None else obj.get("output_format")
    if fmt is None:
        return None
    fmt = as_object(fmt, "output_format")
    if fmt.get("type") != "json_schema" or type(fmt.get("schema")) is not dict:
        raise ClientError("output_format must be {type: json_schema, schema: {...}}")
    return ResponseFormat("json_schema", fmt["schema"])


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
    response_format = _output_format(obj)
    structured = next((t for t in tools if t.name == JSON_TOOL), None)
    if structured is not None:
        # Our own rendering of response_format coming back (a failover hop re-renders it): undo it.
        tools = tuple(t for t in tools if t is not structured)
        schema = structured.parameters
        response_format = (ResponseFormat("json_object") if schema == {"type": "object"}
                           else ResponseFormat("json_schema", schema))
        tool_choice = None
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
        top_k=opt_int(obj, "top_k", "body"),
        parallel_tool_calls=_parallel(obj),
        response_format=response_format,
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        # Anthropic streams always carry usage.
        include_usage=True,
    )


def _document_block(p: DocumentPart) -> dict:
    if p.media_type not in _DOCUMENT_TYPES or (p.url is not None and p.media_type != "application/pdf"):
        raise ClientError(f"a {p.media_type} document cannot be sent to an Anthropic deployment "
                          "(it takes PDF and plain-text documents)")
    if p.url is not None:
        src: dict = {"type": "url", "url": p.url}
    elif p.media_type == "text/plain":
        try:
            text = base64.b64decode(p.data or "", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ClientError("a text/plain document is not base64 UTF-8 text") from None
        src = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        src = {"type": "base64", "media_type": p.media_type, "data": p.data}
    block: dict = {"type": "document", "source": src}
    if p.name:
        block["title"] = p.name
    return block


def _user_blocks(content: tuple[ContentPart, ...]) -> list[dict]:
    out: list[dict] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, DocumentPart):
            out.append(_document_block(p))
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


def tool_id(raw: str) -> str:
    """An id Anthropic accepts for `raw`: itself when it fits the pattern, else a stable stand-in
    (the same raw id always maps to the same one, so a call and its result stay paired)."""
    if _TOOL_ID.match(raw):
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:12]
    return "toolu_" + re.sub(r"[^a-zA-Z0-9_-]", "_", raw)[:40] + "_" + digest


class _ToolIds:
    """Valid, unique tool_use ids for one conversation: a history replayed from a protocol whose
    ids repeat (`call_0` every turn) gets the repeats renamed; each result follows the latest call
    with its id."""

    __slots__ = ("_used", "_current")

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._current: dict[str, str] = {}

    def call(self, raw: str) -> str:
        base = cid = tool_id(raw)
        n = 1
        while cid in self._used:
            n += 1
            cid = f"{base}_{n}"
        self._used.add(cid)
        self._current[raw] = cid
        return cid

    def result(self, raw: str) -> str:
        return self._current.get(raw) or tool_id(raw)


def _tool_result(m: Message, ids: _ToolIds) -> dict:
    if all(type(p) is TextPart for p in m.content):
        content: str | list[dict] = message_text(m)
    else:
        content = _user_blocks(m.content)
    block: dict = {"type": "tool_result", "tool_use_id": ids.result(plain_id(m.tool_call_id or "")), "content": content}
    if m.is_error:
        block["is_error"] = True
    return block


def _structured_output(req: ChatRequest, body: dict) -> None:
    """response_format as a forced tool whose input is the JSON answer (every Claude model has tools)."""
    rf = req.response_format
    if rf is None:
        return
    if req.tool_choice is not None and req.tool_choice.mode in ("none", "tool"):
        raise ClientError(f"response_format with tool_choice {req.tool_choice.mode!r} cannot be expressed "
                          "for an Anthropic deployment")
    schema = rf.schema if rf.type == "json_schema" and rf.schema is not None else {"type": "object"}
    if schema.get("type") != "object":
        raise ClientError("response_format: an Anthropic deployment needs a schema of type object")
    body.setdefault("tools", []).append({"name": JSON_TOOL, "description": "Respond with the final answer as "
                                         "this tool's input.", "input_schema": schema})
    # With tools of its own the model may still call those; otherwise it must answer through ours.
    body["tool_choice"] = {"type": "any"} if req.tools else {"type": "tool", "name": JSON_TOOL}


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    msgs: list[dict] = []
    ids = _ToolIds()
    for m in req.messages:
        if m.role == "assistant":
            blocks: list[dict] = [{"type": "text", "text": p.text} for p in m.content if type(p) is TextPart and p.text]
            for tc in m.tool_calls:
                blocks.append({"type": "tool_use", "id": ids.call(plain_id(tc.id)), "name": tc.name,
                               "input": arguments_object(tc.arguments, name=tc.name)})
            if blocks:
                msgs.append({"role": "assistant", "content": blocks})
            continue
        if m.role == "tool":
            blocks = [_tool_result(m, ids)]
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
    _structured_output(req, body)
    if req.parallel_tool_calls is False and "tools" in body:
        tc = body.setdefault("tool_choice", {"type": "auto"})
        if tc["type"] != "none":  # Anthropic takes the flag on auto, any and tool only
            tc["disable_parallel_tool_use"] = True
    if req.temperature is not None:
        body["temperature"] = min(req.temperature, 1.0)  # Anthropic's range is 0..1
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.top_k is not None:
        body["top_k"] = req.top_k
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
    structured = False
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
            if name == JSON_TOOL:  # the structured answer we asked for as a forced tool
                texts.append(orjson.dumps(inp if type(inp) is dict else {}).decode())
                structured = True
                continue
            calls.append(ToolCall(tid if type(tid) is str else f"call_{len(calls)}", name,
                                  orjson.dumps(inp if type(inp) is dict else {}).decode()))
    sr = obj.get("stop_reason")
    reason = _FINISH_IN.get(sr, "stop") if type(sr) is str else ("tool_calls" if calls else "stop")
    if reason == "tool_calls" and structured and not calls:
        reason = "stop"  # only our structured-output tool was called: that is the answer
    u = obj.get("usage")
    usage = Usage(_input_tokens(u), token_count(u.get("output_tokens"))) if type(u) is dict else Usage()
    rid, model = obj.get("id"), obj.get("model")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(texts),
                        tuple(calls), reason, usage)


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    content: list[dict] = []
    text = resp.content or resp.refusal
    if text:
        content.append({"type": "text", "text": text})
    for tc in resp.tool_calls:
        content.append({"type": "tool_use", "id": tool_id(with_signature(tc.id, tc.signature)), "name": tc.name,
                        "input": arguments_object(tc.arguments, name=tc.name, error=upstream_error)})
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

    __slots__ = ("_blocks", "_ntools", "_json_blocks", "_input")

    def __init__(self) -> None:
        super().__init__()
        self._blocks: dict[int, int] = {}  # content block index -> tool ordinal (tool_use blocks only)
        self._ntools = 0
        self._json_blocks: set[int] = set()  # blocks of our structured-output tool: their input is text
        # Prompt tokens by kind: message_delta may report any of them alone, cumulatively.
        self._input = dict.fromkeys(_INPUT_KINDS, 0)

    def _input_update(self, u: dict) -> int | None:
        seen = False
        for k in _INPUT_KINDS:
            if k in u:
                self._input[k] = token_count(u[k])
                seen = True
        return sum(self._input.values()) if seen else None

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
                out.append(UsageUpdate(self._input_update(u) or 0, token_count(u.get("output_tokens"))))
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
                out.append(UsageUpdate(self._input_update(u), token_count(u.get("output_tokens"))))
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


_INPUT_KINDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def _sse_event(obj: dict) -> bytes:
    # Anthropic names every SSE event after its payload's `type`.
    return encode_event(orjson.dumps(obj), obj["type"])


class _Held:
    """A block that could not open yet (a tool call is streaming): its start and deltas, in order."""

    __slots__ = ("tool", "deltas")

    def __init__(self, tool: ToolCallStart | None) -> None:
        self.tool = tool  # None: a text block
        self.deltas: list[str] = []


class StreamEncoder:
    """Internal stream events -> Anthropic Messages SSE bytes for the client.

    Anthropic streams one block at a time, but other protocols interleave parallel tool calls
    (deltas of call 0 after call 1 started). So once a tool block is open it stays open until
    the stream ends, and whatever starts after it is held and sent, in order, at the end."""

    __slots__ = ("_model", "_started", "_done", "_in", "_out", "_text", "_tool", "_next", "_held",
                 "_held_tools", "_args", "_reason")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._started = False
        self._done = False
        self._in = 0
        self._out = 0
        self._text: int | None = None  # block index of the open text block
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
            "usage": {"input_tokens": self._in, "output_tokens": self._out},
        }}))

    def _open(self, block: dict, parts: list[bytes]) -> int:
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
    def _tool_block(ev: ToolCallStart) -> dict:
        # A Gemini thought signature rides in the id, which the client hands back next turn.
        return {"type": "tool_use", "id": tool_id(with_signature(ev.id, ev.signature)), "name": ev.name, "input": {}}

    def _on_text(self, text: str, parts: list[bytes]) -> None:
        if self._tool is not None:
            if not self._held or self._held[-1].tool is not None:
                self._held.append(_Held(None))
            self._held[-1].deltas.append(text)
            return
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
        for ordinal, frags in self._args.items():
            try:
                arguments_object("".join(frags), error=upstream_error)
            except ModelyardError as e:
                return e.message
        for index in (self._text, self._tool[1] if self._tool else None):
            if index is not None:
                parts.append(_sse_event({"type": "content_block_stop", "index": index}))
        self._text = self._tool = None
        for held in self._held:
            if held.tool is None:
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


# -- the request as the client sent it -----------------------------------------------------------
def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Nothing in the query string changes an Anthropic request."""


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for an Anthropic upstream: streams report usage unasked."""
    return with_model(body, req, upstream_model), False
