"""A Responses API request (`input` items, tools, text format) parsed into a `ChatRequest`.

The gateway stores nothing, so what needs stored state (`previous_response_id`, `conversation`,
`item_reference`) is a 400, as are controls the internal format cannot carry.
"""

from __future__ import annotations

from adapters import openai
from adapters.call_ids import split_signature
from adapters.fields import as_object, load_object, opt_bool, opt_int, opt_list, opt_number, opt_str, req_str
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
    message_text,
)
from adapters.json_types import JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from contracts.errors import ClientError

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


def _image(p: JSONObject, where: str) -> ImagePart:
    url = p.get("image_url")
    if type(url) is not str or not url:
        raise ClientError(f"{where}.image_url is required (file_id needs stored files, which are not supported)")
    if url.startswith("data:"):
        head, sep, data = url.partition(",")
        if not sep or ";base64" not in head:
            raise ClientError(f"{where}.image_url: only base64 data URLs are supported")
        return ImagePart(media_type=head[5:].split(";", 1)[0] or None, data=data)
    return ImagePart(url=url)


def _file(p: JSONObject, where: str) -> DocumentPart:
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

    def message(self, item: JSONObject, where: str) -> None:
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

    def call(self, item: JSONObject, where: str) -> None:
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

    def output(self, item: JSONObject, where: str) -> None:
        cid = req_str(item, "call_id", where)
        text = _output_text(item.get("output"), where)
        self.msgs.append(Message("tool", (TextPart(text),), tool_call_id=cid, name=self._names.get(cid)))


def _input(obj: JSONObject, native: list[str]) -> tuple[str | None, tuple[Message, ...]]:
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
            elif t == "reasoning":  # a replayed reasoning item (encrypted state): only OpenAI reads it
                if "reasoning items" not in native:
                    native.append("reasoning items")
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


def _tools(obj: JSONObject, native: list[str]) -> tuple[ToolDef, ...]:
    raw = opt_list(obj, "tools", "body")
    check_count(raw, MAX_TOOLS, "tools")
    out = []
    for j, t in enumerate(raw):
        tw = f"tools[{j}]"
        t = as_object(t, tw)
        kind = t.get("type")
        if type(kind) is str and kind and kind != "function":
            # A hosted tool (web_search, file_search, mcp, ...) or a custom one: a Responses
            # deployment takes it as sent; no other protocol can carry it.
            if f"{kind} tools" not in native:
                native.append(f"{kind} tools")
            continue
        if kind != "function":
            raise ClientError(f"{tw}.type {kind!r} is not supported: only function tools are")
        params = t.get("parameters")
        if params is not None and type(params) is not dict:
            raise ClientError(f"{tw}.parameters must be an object")
        out.append(ToolDef(req_str(t, "name", tw), opt_str(t, "description", tw), params))
    return tuple(out)


def _tool_choice(obj: JSONObject, native: list[str]) -> ToolChoice | None:
    raw = obj.get("tool_choice")
    if raw is None:
        return None
    if raw in ("auto", "none", "required"):
        return ToolChoice(raw)
    if type(raw) is dict and raw.get("type") == "function":
        return ToolChoice("tool", req_str(raw, "name", "tool_choice"))
    if type(raw) is dict and type(raw.get("type")) is str and f"{raw['type']} tools" in native:
        native.append(f"a {raw['type']} tool_choice")  # one of the request's hosted tools
        return None
    raise ClientError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}")


def _refuse_unsupported(obj: JSONObject, native: list[str]) -> None:
    """What the internal format cannot carry is a clear 400, never silently dropped; `reasoning`
    options only a Responses deployment takes (noted in `native`)."""
    for key, why in _UNSUPPORTED.items():
        if obj.get(key) is not None:
            raise ClientError(f"{key} is not supported: {why}")
    if obj.get("background"):
        raise ClientError("background is not supported: responses are answered in the request")
    reasoning = obj.get("reasoning")
    if reasoning is not None and (type(reasoning) is not dict or any(v is not None for v in reasoning.values())):
        native.append("reasoning options")


def _response_format(obj: JSONObject) -> ResponseFormat | None:
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


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model", path_model)
    if type(model) is not str or not model:
        raise ClientError("model is required and must be a non-empty string")
    return _request(obj, model, stream_hint)


def parse_input_tokens(body: bytes) -> ChatRequest:
    """`POST /v1/responses/input_tokens`' body: a Responses request whose model may be left out (its
    `model` is then ""), read as a call would be (stored state refused the same way)."""
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = obj.get("model")
    if model is not None and (type(model) is not str or not model):
        raise ClientError("model must be a non-empty string")
    return _request(obj, model or "", False)


def _request(obj: JSONObject, model: str, stream_hint: bool) -> ChatRequest:
    native: list[str] = []  # what only a Responses deployment can take (the request passes through)
    _refuse_unsupported(obj, native)
    system, messages = _input(obj, native)
    tools = _tools(obj, native)
    tool_choice = _tool_choice(obj, native)
    return ChatRequest(
        model=model,
        messages=messages,
        system=system,
        tools=tools,
        tool_choice=tool_choice,
        temperature=opt_number(obj, "temperature", "body", 0.0, 2.0),
        top_p=opt_number(obj, "top_p", "body", 0.0, 1.0),
        max_tokens=opt_int(obj, "max_output_tokens", "body"),
        parallel_tool_calls=_parallel_tool_calls(obj),
        response_format=_response_format(obj),
        stream=opt_bool(obj, "stream", "body") or stream_hint,
        native_only=", ".join(native) or None,
    )


def _parallel_tool_calls(obj: JSONObject) -> bool | None:
    v = obj.get("parallel_tool_calls")
    if v is not None and type(v) is not bool:
        raise ClientError("parallel_tool_calls must be a boolean")
    return v


# -- the request as the client sent it -----------------------------------------------------------
check_query = openai.check_query
