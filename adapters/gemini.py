"""Gemini generateContent <-> internal format, pure functions.

POST /v1beta/models/{model}:generateContent and :streamGenerateContent?alt=sse. Gemini has no
tool-call ids: parsing a request synthesizes stable `call_<n>` ids (n counts calls through the
conversation) and pairs each functionResponse with the oldest unanswered call of the same name;
a response's calls get ids unique across conversations (`call_ids.new_call_id`).
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote

import orjson

from adapters.call_ids import new_call_id
from adapters.fields import (
    arguments_object,
    as_object,
    bad_upstream,
    error_message,
    header,
    load_object,
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
from adapters.sse import SSEDecoder, SSEEvent
from modelyard.errors import ClientError, ModelyardError

__all__ = [
    "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response", "render_response",
    "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key", "request_path",
    "check_query", "passthrough_body",
]

CLIENT_AUTH_HEADERS: tuple[str, ...] = ("x-goog-api-key", "authorization")

_FINISH_IN: dict[str, FinishReason] = {
    "STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter", "LANGUAGE": "content_filter", "MALFORMED_FUNCTION_CALL": "error",
}
_FINISH_OUT: dict[FinishReason, str] = {
    "stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY", "error": "OTHER",
}
_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
    500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
# Keys of Gemini's OpenAPI-subset Schema; anything else in a JSON Schema is dropped on the way up.
_SCHEMA_KEYS = frozenset((
    "type", "format", "title", "description", "nullable", "enum", "maxItems", "minItems", "properties",
    "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example", "anyOf",
    "propertyOrdering", "default", "items", "minimum", "maximum",
))
# Google's documented stand-in for a function call whose thought signature was lost on the way
# (history from another protocol): Gemini 3 refuses a replayed call without one.
SKIP_SIGNATURE = "skip_thought_signature_validator"
_MIME_BY_EXT = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
                "webp": "image/webp", "heic": "image/heic", "heif": "image/heif"}


def _get(obj: dict, camel: str, snake: str) -> object:
    v = obj.get(camel)
    return obj.get(snake) if v is None else v


def request_path(model: str, stream: bool) -> str:
    m = quote(model, safe="-._~/")
    return f"/v1beta/models/{m}:streamGenerateContent?alt=sse" if stream else f"/v1beta/models/{m}:generateContent"


# ---- request -------------------------------------------------------------------------------


def _response_text(resp: object) -> str:
    # {"content": "..."} is how other protocols' plain-text tool results travel; unwrap it back.
    if type(resp) is dict and len(resp) == 1:
        for k in ("content", "result", "output"):
            if type(resp.get(k)) is str:
                return resp[k]
    return orjson.dumps(resp).decode()


class _CallIds:
    """Gemini calls carry no ids: number them through the conversation and pair each response
    with the oldest unanswered call of the same name."""

    __slots__ = ("_pending", "_n")

    def __init__(self) -> None:
        self._pending: dict[str, list[str]] = {}  # function name -> ids of calls not yet answered
        self._n = 0

    def _next(self) -> str:
        cid = f"call_{self._n}"
        self._n += 1
        return cid

    def call(self, name: str, cid: object) -> str:
        if type(cid) is not str or not cid:
            cid = f"call_{self._n}"
        self._n += 1  # counted even when the call brings its own id
        self._pending.setdefault(name, []).append(cid)
        return cid

    def response(self, name: str, cid: object) -> str:
        waiting = self._pending.get(name)
        if type(cid) is str and cid:
            if waiting and cid in waiting:
                waiting.remove(cid)
            return cid
        if waiting:
            return waiting.pop(0)
        return self._next()


def _model(obj: dict, path_model: str | None) -> str:
    model = path_model if path_model is not None else obj.get("model")
    if type(model) is not str or not model:
        raise ClientError("model is required (in the path /v1beta/models/{model}:generateContent)")
    return model[7:] if model.startswith("models/") else model


def _function_call(p: dict, pw: str, ids: _CallIds) -> ToolCall:
    fc = as_object(_get(p, "functionCall", "function_call"), f"{pw}.functionCall")
    name = req_str(fc, "name", f"{pw}.functionCall")
    args = fc.get("args", {})
    if type(args) is not dict:
        raise ClientError(f"{pw}.functionCall.args must be an object")
    sig = _get(p, "thoughtSignature", "thought_signature")
    return ToolCall(ids.call(name, fc.get("id")), name, orjson.dumps(args).decode(),
                    sig if type(sig) is str and sig else None)


def _function_response(p: dict, pw: str, ids: _CallIds) -> Message:
    fr = as_object(_get(p, "functionResponse", "function_response"), f"{pw}.functionResponse")
    name = req_str(fr, "name", f"{pw}.functionResponse")
    cid = ids.response(name, fr.get("id"))
    resp = fr.get("response", {})
    # Google's convention: an `error` key (and no output) reports a failed call.
    if type(resp) is dict and set(resp) == {"error"}:
        err = resp["error"]
        text = err if type(err) is str else orjson.dumps(err).decode()
        return Message("tool", (TextPart(text),), tool_call_id=cid, name=name, is_error=True)
    return Message("tool", (TextPart(_response_text(resp)),), tool_call_id=cid, name=name)


def _media(media_type: str | None, data: str | None = None, url: str | None = None) -> ContentPart:
    # Only images are images: a PDF or audio file stays a document, whatever the target does with it.
    if media_type is None or media_type.startswith("image/"):
        return ImagePart(media_type=media_type, data=data, url=url)
    return DocumentPart(media_type, data=data, url=url)


def _content_part(p: dict, pw: str) -> ContentPart | None:
    """A text or media part; None for a thought summary (they do not cross protocols)."""
    if "text" in p:
        text = p["text"]
        if type(text) is not str:
            raise ClientError(f"{pw}.text must be a string")
        return None if p.get("thought") else TextPart(text)
    if "inlineData" in p or "inline_data" in p:
        d = as_object(_get(p, "inlineData", "inline_data"), f"{pw}.inlineData")
        return _media(opt_str(d, "mimeType", pw) or opt_str(d, "mime_type", pw),
                      data=req_str(d, "data", f"{pw}.inlineData"))
    d = as_object(_get(p, "fileData", "file_data"), f"{pw}.fileData")
    uri = d.get("fileUri", d.get("file_uri"))
    if type(uri) is not str or not uri:
        raise ClientError(f"{pw}.fileData.fileUri is required")
    return _media(opt_str(d, "mimeType", pw) or opt_str(d, "mime_type", pw), url=uri)


def _content(c: object, where: str, ids: _CallIds, msgs: list[Message]) -> None:
    """One `contents[i]` turn appended to msgs; each functionResponse part becomes its own tool message."""
    c = as_object(c, where)
    role = c.get("role", "user")
    if role != "user" and role != "model":
        raise ClientError(f"{where}.role {role!r} must be 'user' or 'model'")
    raw_parts = c.get("parts")
    if type(raw_parts) is not list or not raw_parts:
        raise ClientError(f"{where}.parts must be a non-empty array")
    check_count(raw_parts, MAX_CONTENT_PARTS, f"{where}.parts")
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    for j, p in enumerate(raw_parts):
        pw = f"{where}.parts[{j}]"
        p = as_object(p, pw)
        if "text" in p or "inlineData" in p or "inline_data" in p or "fileData" in p or "file_data" in p:
            part = _content_part(p, pw)
            if part is not None and type(part) is not TextPart and role == "user" and msgs and \
                    msgs[-1].role == "tool" and not parts and j > 0:
                # Media right after a functionResponse belongs to that result (how results carry images).
                msgs[-1] = dataclasses.replace(msgs[-1], content=(*msgs[-1].content, part))
            elif part is not None:
                parts.append(part)
        elif ("functionCall" in p or "function_call" in p) and role == "model":
            calls.append(_function_call(p, pw, ids))
        elif ("functionResponse" in p or "function_response" in p) and role == "user":
            msgs.append(_function_response(p, pw, ids))
        else:
            raise ClientError(f"{pw}: unsupported part (keys {sorted(p)[:5]})")
    if parts or calls:
        msgs.append(Message("assistant" if role == "model" else "user", tuple(parts), tuple(calls)))


def _messages(obj: dict) -> tuple[Message, ...]:
    contents = obj.get("contents")
    if type(contents) is not list or not contents:
        raise ClientError("contents must be a non-empty array")
    check_count(contents, MAX_MESSAGES, "contents")
    msgs: list[Message] = []
    ids = _CallIds()
    for i, c in enumerate(contents):
        _content(c, f"contents[{i}]", ids, msgs)
    if not msgs:
        raise ClientError("contents carry no usable parts")
    return tuple(msgs)


def _system(obj: dict) -> str | None:
    si = _get(obj, "systemInstruction", "system_instruction")
    if si is None:
        return None
    si = as_object(si, "systemInstruction")
    texts = []
    si_parts = opt_list(si, "parts", "systemInstruction")
    check_count(si_parts, MAX_CONTENT_PARTS, "systemInstruction.parts")
    for j, p in enumerate(si_parts):
        p = as_object(p, f"systemInstruction.parts[{j}]")
        if type(p.get("text")) is not str:
            raise ClientError(f"systemInstruction.parts[{j}].text must be a string")
        texts.append(p["text"])
    return "".join(texts)


def _tools(obj: dict) -> tuple[ToolDef, ...]:
    tools: list[ToolDef] = []
    raw_tools = _get(obj, "tools", "tools")
    if raw_tools is not None and type(raw_tools) is not list:
        raise ClientError("tools must be an array")
    check_count(raw_tools or (), MAX_TOOLS, "tools")
    for j, t in enumerate(raw_tools or ()):
        t = as_object(t, f"tools[{j}]")
        decls = _get(t, "functionDeclarations", "function_declarations")
        if type(decls) is not list:
            raise ClientError(f"tools[{j}]: only functionDeclarations tools are supported")
        if len(tools) + len(decls) > MAX_TOOLS:
            raise ClientError(f"function declarations exceed the limit of {MAX_TOOLS}", status=413)
        for k, d in enumerate(decls):
            dw = f"tools[{j}].functionDeclarations[{k}]"
            d = as_object(d, dw)
            params = d.get("parametersJsonSchema", d.get("parameters_json_schema"))
            if params is None:  # the OpenAPI-subset spelling: made JSON Schema for other targets
                params = d.get("parameters")
                if params is not None and type(params) is not dict:
                    raise ClientError(f"{dw}.parameters must be an object")
                params = json_schema(params) if params is not None else None
            elif type(params) is not dict:
                raise ClientError(f"{dw}.parametersJsonSchema must be an object")
            tools.append(ToolDef(req_str(d, "name", dw), opt_str(d, "description", dw), params))
    return tuple(tools)


def _tool_choice(obj: dict) -> ToolChoice | None:
    tc = _get(obj, "toolConfig", "tool_config")
    if tc is None:
        return None
    fcc = _get(as_object(tc, "toolConfig"), "functionCallingConfig", "function_calling_config")
    if fcc is None:
        return None
    fcc = as_object(fcc, "toolConfig.functionCallingConfig")
    mode = fcc.get("mode", "AUTO")
    allowed = _get(fcc, "allowedFunctionNames", "allowed_function_names")
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return ToolChoice("auto")
    if mode == "NONE":
        return ToolChoice("none")
    if mode == "ANY":
        if type(allowed) is list and len(allowed) == 1 and type(allowed[0]) is str:
            return ToolChoice("tool", allowed[0])
        return ToolChoice("required")
    raise ClientError("toolConfig.functionCallingConfig.mode must be AUTO, ANY or NONE")


@dataclass(frozen=True, slots=True)
class _Sampling:
    temperature: float | None
    top_p: float | None
    top_k: int | None
    max_tokens: int | None
    stop: tuple[str, ...]
    response_format: ResponseFormat | None


# generationConfig fields as Google's REST examples also spell them (snake_case).
_SNAKE = {"candidateCount": "candidate_count", "stopSequences": "stop_sequences", "temperature": "temperature",
          "topP": "top_p", "topK": "top_k", "maxOutputTokens": "max_output_tokens",
          "responseMimeType": "response_mime_type", "responseSchema": "response_schema",
          "responseJsonSchema": "response_json_schema"}


def _response_format(gc: dict) -> ResponseFormat | None:
    mime = gc.get("responseMimeType")
    js = gc.get("responseJsonSchema")
    schema = js if js is not None else gc.get("responseSchema")
    if mime is None or mime == "text/plain":
        if schema is not None:
            raise ClientError("generationConfig.responseSchema needs responseMimeType application/json")
        return None
    if mime != "application/json":
        raise ClientError(f"generationConfig.responseMimeType {mime!r} is not supported")
    if schema is None:
        return ResponseFormat("json_object")
    if type(schema) is not dict:
        raise ClientError("generationConfig.responseSchema must be an object")
    return ResponseFormat("json_schema", schema if js is not None else json_schema(schema))


def _sampling(obj: dict) -> _Sampling:
    """generationConfig, checked in the order the fields are documented."""
    raw = _get(obj, "generationConfig", "generation_config")
    raw = as_object(raw, "generationConfig") if raw is not None else {}
    gc = {camel: _get(raw, camel, snake) for camel, snake in _SNAKE.items()}
    w = "generationConfig"
    cc = opt_int(gc, "candidateCount", w)
    if cc is not None and cc != 1:
        raise ClientError("generationConfig.candidateCount other than 1 is not supported")
    stop = opt_list(gc, "stopSequences", w)
    if not all(type(s) is str for s in stop):
        raise ClientError("generationConfig.stopSequences must be an array of strings")
    return _Sampling(
        temperature=opt_number(gc, "temperature", w, 0.0, 2.0),
        top_p=opt_number(gc, "topP", w, 0.0, 1.0),
        top_k=opt_int(gc, "topK", w),
        max_tokens=opt_int(gc, "maxOutputTokens", w),
        stop=tuple(stop),
        response_format=_response_format(gc),
    )


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    model = _model(obj, path_model)
    messages = _messages(obj)
    system = _system(obj)
    tools = _tools(obj)
    tool_choice = _tool_choice(obj)
    sampling = _sampling(obj)
    return ChatRequest(
        model=model,
        messages=messages,
        system=system,
        tools=tools,
        tool_choice=tool_choice,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        max_tokens=sampling.max_tokens,
        stop=sampling.stop,
        top_k=sampling.top_k,
        response_format=sampling.response_format,
        stream=stream_hint,
        include_usage=True,  # Gemini chunks always carry usageMetadata
    )


def json_schema(schema: dict) -> dict:
    """Gemini's OpenAPI-subset Schema as JSON Schema for other targets: types lower-case
    (`STRING` -> `string`), `nullable` as a `null` type, Gemini-only keys dropped."""
    out: dict = {}
    for k, v in schema.items():
        if k == "type" and type(v) is str:
            out[k] = v.lower()
        elif k in ("properties",) and type(v) is dict:
            out[k] = {pk: json_schema(pv) if type(pv) is dict else pv for pk, pv in v.items()}
        elif k == "items" and type(v) is dict:
            out[k] = json_schema(v)
        elif k == "anyOf" and type(v) is list:
            out[k] = [json_schema(x) if type(x) is dict else x for x in v]
        elif k not in ("nullable", "propertyOrdering"):
            out[k] = v
    if schema.get("nullable") is True:
        t = out.get("type")
        out["type"] = [t, "null"] if type(t) is str else ["null"]
    return out


def gemini_schema(schema: dict) -> dict:
    """A JSON Schema as Gemini's OpenAPI-subset Schema: `$ref`s into `$defs`/`definitions` are
    inlined, `type: [T, "null"]` and `anyOf [.., {type: null}]` become `nullable`, `const` an enum.
    A recursive schema cannot be inlined and is refused (400)."""
    defs: dict = {}
    for key in ("definitions", "$defs"):
        d = schema.get(key)
        if type(d) is dict:
            defs.update(d)
    out = _schema(schema, defs, ())
    assert type(out) is dict
    return out


def _resolve(ref: str, defs: dict, stack: tuple[str, ...]) -> tuple[str, dict]:
    for prefix in ("#/$defs/", "#/definitions/"):
        if ref.startswith(prefix):
            name = ref[len(prefix):]
            target = defs.get(name)
            if type(target) is dict:
                if name in stack:
                    raise ClientError(f"tool schema: recursive $ref {ref!r} cannot be expressed for Gemini")
                return name, target
    raise ClientError(f"tool schema: $ref {ref!r} does not resolve to a local definition")


def _schema(s: object, defs: dict, stack: tuple[str, ...]) -> object:
    if type(s) is not dict:
        return s
    ref = s.get("$ref")
    if type(ref) is str:
        name, target = _resolve(ref, defs, stack)
        return _schema({**target, **{k: v for k, v in s.items() if k != "$ref"}}, defs, (*stack, name))
    out: dict[str, object] = {}
    for k, v in s.items():
        if k == "type" and type(v) is list:
            types = [t for t in v if t != "null"]
            if len(types) < len(v):
                out["nullable"] = True
            if len(types) == 1:
                out["type"] = types[0]
            elif types:
                out["anyOf"] = [{"type": t} for t in types]
        elif k == "type" and v == "null":
            out["nullable"] = True
        elif k in ("anyOf", "oneOf") and type(v) is list:
            alts = [x for x in v if not (type(x) is dict and x.get("type") == "null")]
            if len(alts) < len(v):
                out["nullable"] = True
            conv = [_schema(x, defs, stack) for x in alts]
            if len(conv) == 1 and type(conv[0]) is dict:
                out.update({ck: cv for ck, cv in conv[0].items() if ck not in out})
            elif conv:
                out["anyOf"] = conv
        elif k == "const":
            out["enum"] = [v]
        elif k not in _SCHEMA_KEYS:
            continue
        elif k == "properties" and type(v) is dict:
            out[k] = {pk: _schema(pv, defs, stack) for pk, pv in v.items()}
        elif k == "items":
            out[k] = _schema(v, defs, stack)
        else:
            out[k] = v
    return out


def _image_part(p: ImagePart | DocumentPart) -> dict:
    if isinstance(p, DocumentPart):
        if p.url is not None:
            return {"fileData": {"mimeType": p.media_type, "fileUri": p.url}}
        return {"inlineData": {"mimeType": p.media_type, "data": p.data}}
    if p.url is not None:
        mime = p.media_type or _MIME_BY_EXT.get(p.url.rsplit(".", 1)[-1].split("?", 1)[0].lower(), "image/jpeg")
        return {"fileData": {"mimeType": mime, "fileUri": p.url}}
    return {"inlineData": {"mimeType": p.media_type or "image/png", "data": p.data}}


def _tool_response(text: str) -> dict:
    # Gemini wants an object; JSON-object results pass as they are, anything else is wrapped.
    if text[:1] == "{":
        try:
            v = orjson.loads(text)
        except orjson.JSONDecodeError:
            v = None
        if type(v) is dict:
            return v
    return {"content": text}


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    """Path and headers of the upstream request, without rendering its body (passthrough)."""
    headers = {"content-type": "application/json"}
    if credential:
        headers["x-goog-api-key"] = credential
    return request_path(upstream_model, req.stream), headers


def _call_parts(calls: tuple[ToolCall, ...], names: dict[str, str]) -> list[dict]:
    parts: list[dict] = []
    signed = any(tc.signature for tc in calls)
    for j, tc in enumerate(calls):
        names[tc.id] = tc.name
        part: dict = {"functionCall": {"name": tc.name, "args": arguments_object(tc.arguments, name=tc.name)}}
        if tc.signature:
            part["thoughtSignature"] = tc.signature
        elif j == 0 and not signed:
            # Gemini 3 checks the first call of each model turn; this history came without one.
            part["thoughtSignature"] = SKIP_SIGNATURE
        parts.append(part)
    return parts


def _result_parts(m: Message, names: dict[str, str]) -> list[dict]:
    name = m.name or names.get(m.tool_call_id or "", "") or "tool"
    text = message_text(m)
    # Google's convention for a failed call: the message under `error`, not `output`.
    response = {"error": text} if m.is_error else _tool_response(text)
    parts: list[dict] = [{"functionResponse": {"name": name, "response": response}}]
    # Images and files of a tool result follow it in the same user turn, as inline parts.
    parts += [_image_part(p) for p in m.content if not isinstance(p, TextPart)]
    return parts


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    if req.parallel_tool_calls is False and req.tools:
        raise ClientError("parallel_tool_calls: false cannot be expressed for a Gemini deployment")
    contents: list[dict] = []
    names: dict[str, str] = {}
    for m in req.messages:
        if m.role == "assistant":
            parts: list[dict] = [{"text": p.text} for p in m.content if type(p) is TextPart and p.text]
            parts += _call_parts(m.tool_calls, names)
            if parts:
                contents.append({"role": "model", "parts": parts})
            continue
        if m.role == "tool":
            parts = _result_parts(m, names)
            # All responses to one model turn's calls travel in one user turn.
            if contents and contents[-1]["role"] == "user" and any("functionResponse" in p for p in contents[-1]["parts"]):
                contents[-1]["parts"].extend(parts)
                continue
        else:
            parts = [{"text": p.text} if isinstance(p, TextPart) else _image_part(p) for p in m.content]
        contents.append({"role": "user", "parts": parts})
    body: dict = {"contents": contents}
    if req.system:
        body["systemInstruction"] = {"parts": [{"text": req.system}]}
    if req.tools:
        decls = []
        for t in req.tools:
            d: dict = {"name": t.name}
            if t.description is not None:
                d["description"] = t.description
            if t.parameters is not None and t.parameters.get("properties"):
                d["parameters"] = gemini_schema(t.parameters)
            decls.append(d)
        body["tools"] = [{"functionDeclarations": decls}]
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        fcc: dict = {"mode": {"auto": "AUTO", "none": "NONE", "required": "ANY", "tool": "ANY"}[mode]}
        if mode == "tool":
            fcc["allowedFunctionNames"] = [req.tool_choice.name]
        body["toolConfig"] = {"functionCallingConfig": fcc}
    gc: dict = {}
    if req.temperature is not None:
        gc["temperature"] = req.temperature
    if req.top_p is not None:
        gc["topP"] = req.top_p
    if req.top_k is not None:
        gc["topK"] = req.top_k
    if req.max_tokens is not None:
        gc["maxOutputTokens"] = req.max_tokens
    if req.stop:
        gc["stopSequences"] = list(req.stop)
    if req.response_format is not None:
        gc["responseMimeType"] = "application/json"
        if req.response_format.schema is not None:
            gc["responseSchema"] = gemini_schema(req.response_format.schema)
    if gc:
        body["generationConfig"] = gc
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


# ---- response ------------------------------------------------------------------------------




def _usage(u: dict) -> Usage:
    # Thinking tokens are billed as output.
    return Usage(token_count(u.get("promptTokenCount")), token_count(u.get("candidatesTokenCount")) + token_count(u.get("thoughtsTokenCount")))


def _candidate_parts(obj: dict) -> tuple[list | None, str | None]:
    cands = obj.get("candidates")
    if type(cands) is not list or not cands or type(cands[0]) is not dict:
        return None, None
    c = cands[0]
    fr = c.get("finishReason")
    content = c.get("content")
    parts = content.get("parts") if type(content) is dict else None
    return (parts if type(parts) is list else []), (fr if type(fr) is str else None)


def _response_call(part: dict, fc: dict, response_id: str, ordinal: int) -> ToolCall:
    cid, args, sig = fc.get("id"), fc.get("args"), part.get("thoughtSignature")
    return ToolCall(cid if type(cid) is str and cid else new_call_id(response_id, ordinal), fc["name"],
                    orjson.dumps(args if type(args) is dict else {}).decode(), sig if type(sig) is str and sig else None)


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    parts, fr = _candidate_parts(obj)
    texts: list[str] = []
    calls: list[ToolCall] = []
    rid = obj.get("responseId")
    reason: FinishReason
    if parts is None:
        pf = obj.get("promptFeedback")
        if not (type(pf) is dict and pf.get("blockReason")):
            raise bad_upstream("no candidates")
        reason = "content_filter"
    else:
        for j, p in enumerate(parts):
            if type(p) is not dict:
                raise bad_upstream(f"parts[{j}] is not an object")
            if type(p.get("text")) is str and not p.get("thought"):
                texts.append(p["text"])
            fc = p.get("functionCall")
            if type(fc) is dict and type(fc.get("name")) is str:
                calls.append(_response_call(p, fc, rid if type(rid) is str else "", len(calls)))
        reason = _FINISH_IN.get(fr or "STOP", "stop")
        if reason == "stop" and calls:
            reason = "tool_calls"
    u = obj.get("usageMetadata")
    model = obj.get("modelVersion")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(texts),
                        tuple(calls), reason, _usage(u) if type(u) is dict else Usage())


def _usage_meta(i: int, o: int) -> dict:
    return {"promptTokenCount": i, "candidatesTokenCount": o, "totalTokenCount": i + o}


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    parts: list[dict] = []
    text = resp.content or resp.refusal
    if text:
        parts.append({"text": text})
    for tc in resp.tool_calls:
        part: dict = {"functionCall": {"name": tc.name,
                                       "args": arguments_object(tc.arguments, name=tc.name, error=upstream_error)}}
        if tc.signature:
            part["thoughtSignature"] = tc.signature
        parts.append(part)
    if not parts:
        parts.append({"text": ""})
    return orjson.dumps({
        "candidates": [{"content": {"role": "model", "parts": parts},
                        "finishReason": _FINISH_OUT[resp.finish_reason], "index": 0}],
        "usageMetadata": _usage_meta(resp.usage.input_tokens, resp.usage.output_tokens),
        "modelVersion": model,
        "responseId": resp.id or uuid.uuid4().hex,
    })


# ---- streaming -----------------------------------------------------------------------------


class StreamDecoder(SSEDecoder):
    """Upstream Gemini SSE bytes -> internal stream events (the stream has no terminator)."""

    __slots__ = ("_started", "_finished", "_ntools", "_rid", "_partial")

    def __init__(self) -> None:
        super().__init__()
        self._started = False
        self._finished = False
        self._ntools = 0
        self._rid = ""  # the stream's responseId: the seed of its calls' ids
        self._partial: _PartialCall | None = None  # a call whose arguments arrive in pieces (Gemini 3)

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        data = ev.data
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is list and len(obj) == 1:
            obj = obj[0]
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
            rid, model = obj.get("responseId"), obj.get("modelVersion")
            self._rid = rid if type(rid) is str and rid else uuid.uuid4().hex
            out.append(StreamStart(rid if type(rid) is str else "", model if type(model) is str else ""))
        parts, fr = _candidate_parts(obj)
        for p in parts or ():
            if type(p) is not dict:
                continue
            text = p.get("text")
            if type(text) is str and text and not p.get("thought"):
                out.append(TextDelta(text))
            fc = p.get("functionCall")
            if type(fc) is dict:
                self._function_call(p, fc, out)
        if parts is None:
            pf = obj.get("promptFeedback")
            if type(pf) is dict and pf.get("blockReason"):
                fr = "SAFETY"
        if fr is not None and not self._finished:
            self._finished = True
            reason = _FINISH_IN.get(fr, "stop")
            out.append(StreamFinish("tool_calls" if reason == "stop" and self._ntools else reason))
        u = obj.get("usageMetadata")
        if type(u) is dict and ("promptTokenCount" in u or "candidatesTokenCount" in u):
            # Vertex sends usageMetadata without counts (trafficType only): that reports nothing.
            us = _usage(u)
            out.append(UsageUpdate(us.input_tokens, us.output_tokens))

    def _function_call(self, part: dict, fc: dict, out: list[StreamEvent]) -> None:
        """A whole call, or (streamed arguments) its start, argument pieces and closing `{}`."""
        pending = self._partial
        if pending is not None:
            pieces = fc.get("partialArgs")
            if type(pieces) is list:
                pending.add(pieces)
            if fc.get("willContinue") is True or "name" in fc:
                return
            self._partial = None  # `functionCall: {}` closes the call
            fc, part = {**pending.fc, "args": pending.args}, pending.part
        elif fc.get("willContinue") is True and type(fc.get("name")) is str:
            self._partial = _PartialCall(part, fc)
            return
        if type(fc.get("name")) is not str:
            return
        n = self._ntools
        self._ntools += 1
        tc = _response_call(part, fc, self._rid, n)
        out.append(ToolCallStart(n, tc.id, tc.name, tc.signature))
        out.append(ToolCallDelta(n, tc.arguments))

    def _cut(self) -> StreamEvent:
        # Gemini ends a stream by closing it; only a finishReason tells a whole stream from a cut one.
        return StreamEnd() if self._finished else StreamError("upstream stream ended before finishReason")


_PATH_STEP = re.compile(r"\.([A-Za-z_$][\w$-]*)|\[(\d+)\]|\[['\"]([^'\"]+)['\"]\]")


class _PartialCall:
    """A Gemini 3 call streamed with `partialArgs` (jsonPath + value pieces; a string value may
    come in several pieces while `willContinue` is set), assembled into its args object."""

    __slots__ = ("part", "fc", "args", "_open")

    def __init__(self, part: dict, fc: dict) -> None:
        self.part = part  # carries the thoughtSignature, if any
        self.fc = fc
        self.args: dict = {}
        self._open: str | None = None  # path of a string value still arriving

    def add(self, pieces: list) -> None:
        for piece in pieces:
            if type(piece) is not dict or type(piece.get("jsonPath")) is not str:
                continue
            path = piece["jsonPath"]
            for key in ("stringValue", "numberValue", "boolValue", "nullValue"):
                if key in piece:
                    value = None if key == "nullValue" else piece[key]
                    if key == "stringValue" and self._open == path:
                        value = str(self._get(path) or "") + str(value)
                    self._set(path, value)
                    break
            self._open = path if piece.get("willContinue") is True else None

    def _steps(self, path: str) -> list[str | int]:
        if not path.startswith("$"):
            raise bad_upstream(f"partialArgs jsonPath {path!r}")
        steps: list[str | int] = []
        for m in _PATH_STEP.finditer(path, 1):
            steps.append(int(m[2]) if m[2] is not None else (m[1] or m[3]))
        return steps

    def _get(self, path: str) -> object:
        node: object = self.args
        for step in self._steps(path):
            if type(node) is dict and type(step) is str:
                node = node.get(step)
            elif type(node) is list and type(step) is int and step < len(node):
                node = node[step]
            else:
                return None
        return node

    def _set(self, path: str, value: object) -> None:
        steps = self._steps(path)
        if not steps:
            return
        node: object = self.args
        for step, nxt in zip(steps, steps[1:]):
            child: object = [] if type(nxt) is int else {}
            if type(node) is dict and type(step) is str:
                node = node.setdefault(step, child)
            elif type(node) is list and type(step) is int:
                while len(node) <= step:
                    node.append(None)
                if node[step] is None:
                    node[step] = child
                node = node[step]
            else:
                raise bad_upstream(f"partialArgs jsonPath {path!r} does not fit the arguments so far")
        last = steps[-1]
        if type(node) is dict and type(last) is str:
            node[last] = value
        elif type(node) is list and type(last) is int:
            while len(node) <= last:
                node.append(None)
            node[last] = value
        else:
            raise bad_upstream(f"partialArgs jsonPath {path!r} does not fit the arguments so far")


class StreamEncoder:
    """Internal stream events -> Gemini `data: {candidates..}` SSE bytes for the client."""

    __slots__ = ("_model", "_id", "_done", "_in", "_out", "_calls", "_reason")

    def __init__(self, *, model: str, request: ChatRequest | None = None) -> None:
        self._model = model
        self._id = ""
        self._done = False
        self._in = 0
        self._out = 0
        self._calls: dict[int, list[str]] = {}  # tool ordinal -> [name, arguments text so far, signature]
        self._reason = "STOP"

    def _chunk(self, parts: list[dict], finish: str | None = None) -> bytes:
        cand: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish is not None:
            cand["finishReason"] = finish
        obj: dict = {"candidates": [cand]}
        if finish is not None:
            obj["usageMetadata"] = _usage_meta(self._in, self._out)
        obj["modelVersion"] = self._model
        if not self._id:
            self._id = uuid.uuid4().hex
        obj["responseId"] = self._id
        return b"data: " + orjson.dumps(obj) + b"\r\n\r\n"

    def encode(self, events: list[StreamEvent]) -> bytes:
        parts: list[bytes] = []
        for ev in events:
            if self._done:
                break
            if isinstance(ev, TextDelta):
                parts.append(self._chunk([{"text": ev.text}]))
            elif isinstance(ev, ToolCallStart):
                self._calls[ev.index] = [ev.name, "", ev.signature or ""]
            elif isinstance(ev, ToolCallDelta):
                c = self._calls.get(ev.index)
                if c is not None:
                    c[1] += ev.arguments
            elif isinstance(ev, UsageUpdate):
                if ev.input_tokens is not None:
                    self._in = ev.input_tokens
                if ev.output_tokens is not None:
                    self._out = ev.output_tokens
            elif isinstance(ev, StreamStart):
                if not self._id:
                    self._id = ev.id
            elif isinstance(ev, StreamFinish):
                self._reason = _FINISH_OUT[ev.reason]
            elif isinstance(ev, StreamEnd):
                self._done = True
                # Gemini sends whole function calls, so streamed argument fragments are joined here.
                try:
                    fparts = [self._call_part(*c) for c in self._calls.values()]
                except ModelyardError as e:
                    parts.append(b"data: " + render_error(502, e.message, "api_error") + b"\r\n\r\n")
                    continue
                parts.append(self._chunk(fparts or [{"text": ""}], self._reason))
            elif isinstance(ev, StreamError):
                self._done = True
                parts.append(b"data: " + render_error(500, ev.message, ev.type) + b"\r\n\r\n")
        return b"".join(parts)

    @staticmethod
    def _call_part(name: str, arguments: str, signature: str) -> dict:
        part: dict = {"functionCall": {"name": name, "args": arguments_object(arguments, name=name, error=upstream_error)}}
        if signature:
            part["thoughtSignature"] = signature
        return part


# ---- errors and auth -----------------------------------------------------------------------


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    st = _STATUS.get(status)
    if st is None:
        st = "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL"
    if type == "overloaded_error":
        st = "UNAVAILABLE"
    return orjson.dumps({"error": {"code": status, "message": message, "status": st}})


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    key = header(headers, "x-goog-api-key")
    if key:
        return key.strip() or None
    q = query.get("key")
    if q:
        return q
    return None


# -- the request as the client sent it -----------------------------------------------------------
def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """`streamGenerateContent` answers in server-sent events only when asked with `alt=sse`."""
    if stream_hint and query.get("alt") != "sse":
        raise ClientError("streamGenerateContent is served as server-sent events: add ?alt=sse")


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body as sent: a Gemini request names its model in the path."""
    return body, False
