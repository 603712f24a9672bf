"""An Anthropic Messages request parsed into a `ChatRequest` (the client's side; render.py
writes the upstream's)."""

from __future__ import annotations

import base64
from collections.abc import Mapping

import orjson

from adapters.anthropic.wire import JSON_TOOL
from adapters.cache_marks import marker_ttl
from adapters.call_ids import split_signature
from adapters.fields import as_object, header, load_object, opt_bool, opt_int, opt_list, opt_number, opt_str, req_str
from adapters.internal import (
    CacheTtl,
    ChatRequest,
    ContentPart,
    DocumentPart,
    ImagePart,
    Message,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDef,
)
from adapters.json_types import JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from contracts.errors import ClientError

PATH = "/v1/messages"
API_VERSION = "2023-06-01"
# Anthropic requires max_tokens; clients of other protocols may omit it.
DEFAULT_MAX_TOKENS = 4096
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("x-api-key", "authorization")


def cache_mark(block: JSONObject, where: str) -> CacheTtl | None:
    """A block's `cache_control` as a marker: ephemeral, 5 minutes unless `ttl` says 1h."""
    raw = block.get("cache_control")
    if raw is None:
        return None
    cc = as_object(raw, f"{where}.cache_control")
    if cc.get("type") != "ephemeral":
        raise ClientError(f"{where}.cache_control.type must be 'ephemeral'")
    return marker_ttl(cc, f"{where}.cache_control")


def _image(block: JSONObject, where: str) -> ImagePart:
    src = as_object(block.get("source"), f"{where}.source")
    st = src.get("type")
    mark = cache_mark(block, where)
    if st == "base64":
        return ImagePart(media_type=opt_str(src, "media_type", f"{where}.source"),
                         data=req_str(src, "data", f"{where}.source"), cache=mark)
    if st == "url":
        return ImagePart(url=req_str(src, "url", f"{where}.source"), cache=mark)
    raise ClientError(f"{where}.source.type {st!r} is not supported")


def _document(block: JSONObject, where: str) -> DocumentPart:
    src = as_object(block.get("source"), f"{where}.source")
    st = src.get("type")
    title = opt_str(block, "title", where)
    mark = cache_mark(block, where)
    if st == "base64":
        return DocumentPart(opt_str(src, "media_type", f"{where}.source") or "application/pdf",
                            data=req_str(src, "data", f"{where}.source"), name=title, cache=mark)
    if st == "url":
        return DocumentPart("application/pdf", url=req_str(src, "url", f"{where}.source"), name=title, cache=mark)
    if st == "text":
        text = req_str(src, "data", f"{where}.source")
        return DocumentPart("text/plain", data=base64.b64encode(text.encode()).decode(), name=title, cache=mark)
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
            parts.append(TextPart(text, cache_mark(b, bw)))
        elif t == "image":
            parts.append(_image(b, bw))
        elif t == "document":
            parts.append(_document(b, bw))
        else:
            raise ClientError(f"{bw}.type {t!r} is not supported")
    return tuple(parts) or (TextPart(""),)


def _system(raw: object) -> tuple[str, tuple[TextPart, ...]]:
    """The system prompt: a string or text blocks (images there are dropped); the blocks are kept
    only when one carries a cache marker."""
    if type(raw) is str:
        return raw, ()
    if type(raw) is not list:
        raise ClientError("system must be a string or an array of blocks")
    check_count(raw, MAX_CONTENT_PARTS, "system blocks")
    out: list[TextPart] = []
    for j, b in enumerate(raw):
        b = as_object(b, f"system[{j}]")
        if b.get("type") == "text":
            t = b.get("text")
            if type(t) is not str:
                raise ClientError(f"system[{j}].text must be a string")
            out.append(TextPart(t, cache_mark(b, f"system[{j}]")))
        elif b.get("type") != "image":
            raise ClientError(f"system[{j}].type {b.get('type')!r} is not supported")
    text = "".join(p.text for p in out)
    return text, tuple(out) if any(p.cache is not None for p in out) else ()


def _turn(m: object, where: str, names: dict[str, str], msgs: list[Message], native: list[str]) -> None:
    """One `messages[i]` turn appended to msgs; each tool_result block becomes its own tool message; a
    server tool's blocks (web search, code execution) are named in `native`: only Anthropic reads them."""
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
            parts.append(TextPart(text, cache_mark(b, bw)))
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
                                tool_call_id=tid, name=names.get(tid), is_error=opt_bool(b, "is_error", bw),
                                cache=cache_mark(b, bw)))
        elif t in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # reasoning traces do not cross protocols
        elif role == "assistant" and type(t) is str and (t == "server_tool_use" or t.endswith("_tool_result")):
            native.append(f"{bw}.{t}")
        else:
            raise ClientError(f"{bw}.type {t!r} is not supported in a {role} message")
    if parts or calls:
        msgs.append(Message(role, tuple(parts), tuple(calls)))


def _messages(obj: JSONObject, native: list[str]) -> tuple[Message, ...]:
    raw_msgs = obj.get("messages")
    if type(raw_msgs) is not list or not raw_msgs:
        raise ClientError("messages must be a non-empty array")
    check_count(raw_msgs, MAX_MESSAGES, "messages")
    msgs: list[Message] = []
    names: dict[str, str] = {}  # tool_use id -> name, so tool results know their function
    for i, m in enumerate(raw_msgs):
        _turn(m, f"messages[{i}]", names, msgs, native)
    if not msgs:
        raise ClientError("messages carry no content")
    return tuple(msgs)


def _tools(obj: JSONObject, native: list[str]) -> tuple[ToolDef, ...]:
    """Custom tools; Anthropic's server tools (web_search_20250305, code_execution_..., ...) are named in
    `native`: only an Anthropic deployment runs them."""
    tools = []
    raw_tools = opt_list(obj, "tools", "body")
    check_count(raw_tools, MAX_TOOLS, "tools")
    for j, t in enumerate(raw_tools):
        tw = f"tools[{j}]"
        t = as_object(t, tw)
        kind = t.get("type", "custom")
        if kind != "custom":
            if type(kind) is not str or not kind:
                raise ClientError(f"{tw}.type must be a string")
            native.append(f"{tw}.{kind}")
            continue
        schema = t.get("input_schema")
        if type(schema) is not dict:
            raise ClientError(f"{tw}.input_schema must be an object")
        tools.append(ToolDef(req_str(t, "name", tw), opt_str(t, "description", tw), schema, cache_mark(t, tw)))
    return tuple(tools)


def _parallel(obj: JSONObject) -> bool | None:
    tc = obj.get("tool_choice")
    if type(tc) is dict and opt_bool(tc, "disable_parallel_tool_use", "tool_choice"):
        return False
    return None


def _output_format(obj: JSONObject) -> ResponseFormat | None:
    # Structured outputs: `output_format` (beta) or `output_config.format`.
    oc = obj.get("output_config")
    fmt = as_object(oc, "output_config").get("format") if oc is not None else obj.get("output_format")
    if fmt is None:
        return None
    fmt = as_object(fmt, "output_format")
    if fmt.get("type") != "json_schema" or type(fmt.get("schema")) is not dict:
        raise ClientError("output_format must be {type: json_schema, schema: {...}}")
    return ResponseFormat("json_schema", fmt["schema"])


def _tool_choice(obj: JSONObject) -> ToolChoice | None:
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
    return _request(obj, model, max_tokens, stream_hint)


def parse_count_tokens(body: bytes) -> ChatRequest:
    """`POST /v1/messages/count_tokens`' body: a Messages request that takes no `max_tokens`."""
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model")
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    return _request(obj, model, opt_int(obj, "max_tokens", "body"), False)


def _request(obj: JSONObject, model: str, max_tokens: int | None, stream_hint: bool) -> ChatRequest:
    native: list[str] = []  # what only an Anthropic deployment can take (the request passes through)
    messages = _messages(obj, native)
    system = obj.get("system")
    system_text, system_blocks = _system(system) if system is not None else (None, ())
    tools = _tools(obj, native)
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
        system_blocks=system_blocks,
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
        native_only=", ".join(native) or None,
    )


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
