"""A Gemini generateContent request parsed into a `ChatRequest` (the client's side; render.py
writes the upstream's).

Gemini has no tool-call ids: parsing synthesizes stable `call_<n>` ids (n counts calls through the
conversation) and pairs each functionResponse with the oldest unanswered call of the same name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from adapters.fields import as_object, header, load_object, opt_int, opt_list, opt_number, opt_str, req_str
from adapters.gemini.schema import json_schema
from adapters.gemini.wire import _get
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
from adapters.json_types import JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from contracts.errors import ClientError

CLIENT_AUTH_HEADERS: tuple[str, ...] = ("x-goog-api-key", "authorization")

def _response_text(resp: object) -> str:
    # {"content": "..."} is how other protocols' plain-text tool results travel; unwrap it back.
    if type(resp) is dict and len(resp) == 1:
        for k in ("content", "result", "output"):
            v = resp.get(k)
            if type(v) is str:
                return v
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


def _model(obj: JSONObject, path_model: str | None) -> str:
    model = path_model if path_model is not None else obj.get("model")
    if type(model) is not str or not model:
        raise ClientError("model is required (in the path /v1beta/models/{model}:generateContent)")
    return model[7:] if model.startswith("models/") else model


def _function_call(p: JSONObject, pw: str, ids: _CallIds) -> ToolCall:
    fc = as_object(_get(p, "functionCall", "function_call"), f"{pw}.functionCall")
    name = req_str(fc, "name", f"{pw}.functionCall")
    args = fc.get("args", {})
    if type(args) is not dict:
        raise ClientError(f"{pw}.functionCall.args must be an object")
    sig = _get(p, "thoughtSignature", "thought_signature")
    return ToolCall(ids.call(name, fc.get("id")), name, orjson.dumps(args).decode(),
                    sig if type(sig) is str and sig else None)


def _function_response(p: JSONObject, pw: str, ids: _CallIds) -> Message:
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


def _content_part(p: JSONObject, pw: str) -> ContentPart | None:
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


def _messages(obj: JSONObject) -> tuple[Message, ...]:
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


def _system(obj: JSONObject) -> str | None:
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


def _tools(obj: JSONObject, native: list[str]) -> tuple[ToolDef, ...]:
    """Function declarations; Gemini's own tools (googleSearch, codeExecution, urlContext, ...) are
    named in `native`: only a Gemini deployment runs them."""
    tools: list[ToolDef] = []
    raw_tools = _get(obj, "tools", "tools")
    if raw_tools is not None and type(raw_tools) is not list:
        raise ClientError("tools must be an array")
    check_count(raw_tools or (), MAX_TOOLS, "tools")
    for j, t in enumerate(raw_tools or ()):
        t = as_object(t, f"tools[{j}]")
        own = [k for k in t if k not in ("functionDeclarations", "function_declarations")]
        native += [f"tools[{j}].{k}" for k in own]
        decls = _get(t, "functionDeclarations", "function_declarations")
        if decls is None and own:
            continue
        if type(decls) is not list:
            raise ClientError(f"tools[{j}] must declare functions (functionDeclarations) or name a Gemini tool")
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


def _tool_choice(obj: JSONObject) -> ToolChoice | None:
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
    seed: int | None
    max_tokens: int | None
    stop: tuple[str, ...]
    response_format: ResponseFormat | None
    choices: int


# Gemini's own bound on generationConfig.candidateCount.
MAX_CANDIDATES = 8
# generationConfig fields as Google's REST examples also spell them (snake_case).
_SNAKE = {"candidateCount": "candidate_count", "stopSequences": "stop_sequences", "temperature": "temperature",
          "topP": "top_p", "topK": "top_k", "seed": "seed", "maxOutputTokens": "max_output_tokens",
          "responseMimeType": "response_mime_type", "responseSchema": "response_schema",
          "responseJsonSchema": "response_json_schema"}


def _response_format(gc: JSONObject) -> ResponseFormat | None:
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


def _sampling(obj: JSONObject) -> _Sampling:
    """generationConfig, checked in the order the fields are documented."""
    raw = _get(obj, "generationConfig", "generation_config")
    raw = as_object(raw, "generationConfig") if raw is not None else {}
    gc = {camel: _get(raw, camel, snake) for camel, snake in _SNAKE.items()}
    w = "generationConfig"
    cc = opt_int(gc, "candidateCount", w)
    if cc is not None and not 1 <= cc <= MAX_CANDIDATES:
        raise ClientError(f"generationConfig.candidateCount must be from 1 to {MAX_CANDIDATES}")
    stop = opt_list(gc, "stopSequences", w)
    if not all(type(s) is str for s in stop):
        raise ClientError("generationConfig.stopSequences must be an array of strings")
    return _Sampling(
        temperature=opt_number(gc, "temperature", w, 0.0, 2.0),
        top_p=opt_number(gc, "topP", w, 0.0, 1.0),
        top_k=opt_int(gc, "topK", w),
        seed=opt_int(gc, "seed", w),
        max_tokens=opt_int(gc, "maxOutputTokens", w),
        stop=tuple(stop),
        response_format=_response_format(gc),
        choices=cc or 1,
    )


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    return _request(load_object(body, max_values=MAX_CHAT_JSON_VALUES), path_model, stream_hint)


def parse_count_tokens(body: bytes, *, path_model: str | None = None) -> ChatRequest:
    """`:countTokens`' body: `contents`, or a whole `generateContentRequest` (system instruction and tools too)."""
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    inner = obj.get("generateContentRequest")
    return _request(inner if isinstance(inner, dict) else obj, path_model, False)


def _request(obj: JSONObject, path_model: str | None, stream_hint: bool) -> ChatRequest:
    model = _model(obj, path_model)
    messages = _messages(obj)
    system = _system(obj)
    native: list[str] = []  # what only a Gemini deployment can take (the request passes through)
    tools = _tools(obj, native)
    tool_choice = _tool_choice(obj)
    sampling = _sampling(obj)
    if sampling.choices > 1:
        native.append("generationConfig.candidateCount > 1")
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
        seed=sampling.seed,
        response_format=sampling.response_format,
        stream=stream_hint,
        include_usage=True,  # Gemini chunks always carry usageMetadata
        choices=sampling.choices,
        native_only=", ".join(native) or None,
    )


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
