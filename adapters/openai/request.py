"""An OpenAI Chat Completions request parsed into a `ChatRequest` (the client's side; render.py
writes the upstream's)."""

from __future__ import annotations

from collections.abc import Mapping

from adapters.call_ids import split_signature
from adapters.fields import as_object, header, load_object, opt_bool, opt_int, opt_list, opt_number, opt_str, req_str
from adapters.internal import (
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
from adapters.json_types import JSONArray, JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from contracts.errors import ClientError

PATH = "/v1/chat/completions"
MAX_CHOICES = 128  # OpenAI's own bound on `n`
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("authorization",)
_ROLES = frozenset(("system", "developer", "user", "assistant", "tool"))


def _image(part: JSONObject, where: str) -> ImagePart:
    iu = part.get("image_url")
    url = iu if type(iu) is str else req_str(as_object(iu, f"{where}.image_url"), "url", f"{where}.image_url")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or ";base64" not in head:
            raise ClientError(f"{where}.image_url.url: only base64 data URLs are supported")
        return ImagePart(media_type=head[5:].split(";", 1)[0] or None, data=data)
    return ImagePart(url=url)


def _file(part: JSONObject, where: str) -> DocumentPart:
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


def _tool_calls(raw: JSONArray, where: str) -> tuple[ToolCall, ...]:
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


def _messages(obj: JSONObject) -> tuple[str | None, tuple[Message, ...]]:
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


def _tools(obj: JSONObject) -> tuple[ToolDef, ...]:
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


def _tool_choice(obj: JSONObject) -> ToolChoice | None:
    tc_raw = obj.get("tool_choice")
    if tc_raw is None:
        return None
    if tc_raw == "auto" or tc_raw == "none" or tc_raw == "required":
        return ToolChoice(tc_raw)
    if type(tc_raw) is dict:
        fn = as_object(tc_raw.get("function"), "tool_choice.function")
        return ToolChoice("tool", req_str(fn, "name", "tool_choice.function"))
    raise ClientError("tool_choice must be 'auto', 'none', 'required' or a function object")


def _stop(obj: JSONObject) -> tuple[str, ...]:
    stop_raw = obj.get("stop")
    if stop_raw is None:
        return ()
    if type(stop_raw) is str:
        return (stop_raw,)
    if type(stop_raw) is list and all(type(s) is str for s in stop_raw):
        return tuple(stop_raw)
    raise ClientError("stop must be a string or an array of strings")


def _choices(obj: JSONObject) -> int:
    n = opt_int(obj, "n", "body")
    if n is not None and not 1 <= n <= MAX_CHOICES:
        raise ClientError(f"n must be from 1 to {MAX_CHOICES}")
    return n or 1


def _max_tokens(obj: JSONObject) -> int | None:
    max_tokens = opt_int(obj, "max_completion_tokens", "body")
    return opt_int(obj, "max_tokens", "body") if max_tokens is None else max_tokens


def _response_format(obj: JSONObject) -> ResponseFormat | None:
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
    choices = _choices(obj)
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
        seed=opt_int(obj, "seed", "body"),
        parallel_tool_calls=ptc,
        response_format=_response_format(obj),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        include_usage=include_usage,
        choices=choices,
        native_only="n > 1" if choices > 1 else None,
    )


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    auth = header(headers, "authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return None


# -- the request as the client sent it -----------------------------------------------------------
def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Nothing in the query string changes an OpenAI request."""
