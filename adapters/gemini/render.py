"""A `ChatRequest` rendered as a Gemini generateContent request (path, headers, body)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote

import orjson

from adapters.controls import lacking
from adapters.fields import arguments_object
from adapters.gemini.schema import gemini_schema
from adapters.gemini.wire import (
    ContentOut,
    FunctionCallingConfig,
    FunctionCallPart,
    FunctionDeclaration,
    GenerateContentRequest,
    GenerationConfig,
    MediaPart,
    PartOut,
)
from adapters.internal import (
    ChatRequest,
    DocumentPart,
    ImagePart,
    Message,
    RenderOptions,
    TextPart,
    ToolCall,
    UpstreamRequest,
    message_text,
)
from adapters.json_types import JSONObject
from contracts.errors import ClientError

# Google's documented stand-in for a function call whose thought signature was lost on the way
# (history from another protocol): Gemini 3 refuses a replayed call without one.
SKIP_SIGNATURE = "skip_thought_signature_validator"


SUPPORTED_CONTROLS = frozenset({"top_k", "seed"})


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    return lacking(req, SUPPORTED_CONTROLS)


def request_path(model: str, stream: bool) -> str:
    m = quote(model, safe="-._~/")
    return f"/v1beta/models/{m}:streamGenerateContent?alt=sse" if stream else f"/v1beta/models/{m}:generateContent"


_MIME_BY_EXT = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif",
                "webp": "image/webp", "heic": "image/heic", "heif": "image/heif"}


def _image_part(p: ImagePart | DocumentPart) -> MediaPart:
    if isinstance(p, DocumentPart):
        if p.url is not None:
            return {"fileData": {"mimeType": p.media_type, "fileUri": p.url}}
        return {"inlineData": {"mimeType": p.media_type, "data": p.data}}
    if p.url is not None:
        mime = p.media_type or _MIME_BY_EXT.get(p.url.rsplit(".", 1)[-1].split("?", 1)[0].lower(), "image/jpeg")
        return {"fileData": {"mimeType": mime, "fileUri": p.url}}
    return {"inlineData": {"mimeType": p.media_type or "image/png", "data": p.data}}


def _tool_response(text: str) -> JSONObject:
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


def _call_parts(calls: tuple[ToolCall, ...], names: dict[str, str]) -> list[PartOut]:
    parts: list[PartOut] = []
    signed = any(tc.signature for tc in calls)
    for j, tc in enumerate(calls):
        names[tc.id] = tc.name
        part: FunctionCallPart = {"functionCall": {"name": tc.name, "args": arguments_object(tc.arguments, name=tc.name)}}
        if tc.signature:
            part["thoughtSignature"] = tc.signature
        elif j == 0 and not signed:
            # Gemini 3 checks the first call of each model turn; this history came without one.
            part["thoughtSignature"] = SKIP_SIGNATURE
        parts.append(part)
    return parts


def _result_parts(m: Message, names: dict[str, str]) -> list[PartOut]:
    name = m.name or names.get(m.tool_call_id or "", "") or "tool"
    text = message_text(m)
    # Google's convention for a failed call: the message under `error`, not `output`.
    response = {"error": text} if m.is_error else _tool_response(text)
    parts: list[PartOut] = [{"functionResponse": {"name": name, "response": response}}]
    # Images and files of a tool result follow it in the same user turn, as inline parts.
    parts += [_image_part(p) for p in m.content if not isinstance(p, TextPart)]
    return parts


_MODES: dict[str, Literal["AUTO", "NONE", "ANY"]] = {"auto": "AUTO", "none": "NONE", "required": "ANY", "tool": "ANY"}


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    if req.parallel_tool_calls is False and req.tools:
        raise ClientError("parallel_tool_calls: false cannot be expressed for a Gemini deployment")
    contents: list[ContentOut] = []
    names: dict[str, str] = {}
    for m in req.messages:
        if m.role == "assistant":
            parts: list[PartOut] = [{"text": p.text} for p in m.content if type(p) is TextPart and p.text]
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
    body: GenerateContentRequest = {"contents": contents}
    if req.system:
        body["systemInstruction"] = {"parts": [{"text": req.system}]}
    if req.tools:
        decls: list[FunctionDeclaration] = []
        for t in req.tools:
            d: FunctionDeclaration = {"name": t.name}
            if t.description is not None:
                d["description"] = t.description
            if t.parameters is not None and t.parameters.get("properties"):
                d["parameters"] = gemini_schema(t.parameters)
            decls.append(d)
        body["tools"] = [{"functionDeclarations": decls}]
    if req.tool_choice is not None:
        mode = req.tool_choice.mode
        fcc: FunctionCallingConfig = {"mode": _MODES[mode]}
        if mode == "tool":
            fcc["allowedFunctionNames"] = [req.tool_choice.name]
        body["toolConfig"] = {"functionCallingConfig": fcc}
    gc: GenerationConfig = {}
    if req.temperature is not None:
        gc["temperature"] = req.temperature
    if req.top_p is not None:
        gc["topP"] = req.top_p
    if req.top_k is not None:
        gc["topK"] = req.top_k
    if req.seed is not None:
        gc["seed"] = req.seed
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


# -- the client's own body, same protocol both ways ---------------------------------------------
def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body as sent: a Gemini request names its model in the path."""
    return body, False
