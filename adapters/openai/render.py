"""A `ChatRequest` rendered as an OpenAI Chat Completions request (path, headers, body)."""

from __future__ import annotations

import orjson

from adapters.call_ids import plain_id
from adapters.controls import lacking, refuse
from adapters.internal import (
    ChatRequest,
    ContentPart,
    DocumentPart,
    Message,
    RenderOptions,
    ResponseFormat,
    TextPart,
    ToolCall,
    ToolDef,
    UpstreamRequest,
    message_text,
)
from adapters.openai.request import PATH
from adapters.openai.wire import (
    AssistantMessageOut,
    ChatCompletionRequest,
    ContentPartOut,
    FileContentOut,
    FunctionDefOut,
    JSONSchemaFormat,
    MessageOut,
    ResponseFormatOut,
    ToolCallOut,
)
from adapters.passthrough import with_model
from contracts.errors import ClientError

# top_k is not OpenAI's (only OpenAI-compatible servers take it, on the passthrough path).
SUPPORTED_CONTROLS = frozenset({"seed"})


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    return lacking(req, SUPPORTED_CONTROLS)


def _render_content(content: tuple[ContentPart, ...]) -> str | list[ContentPartOut]:
    if len(content) == 1 and type(content[0]) is TextPart:
        return content[0].text
    out: list[ContentPartOut] = []
    for p in content:
        if isinstance(p, TextPart):
            out.append({"type": "text", "text": p.text})
        elif isinstance(p, DocumentPart):
            out.append(_file_part(p))
        else:
            url = p.url if p.url is not None else f"data:{p.media_type or 'image/png'};base64,{p.data}"
            out.append({"type": "image_url", "image_url": {"url": url}})
    return out


def _file_part(p: DocumentPart) -> FileContentOut:
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


def _call(tc: ToolCall, call_id: str) -> ToolCallOut:
    # A call without arguments is "{}" on every path, as OpenAI itself sends it.
    return {"id": call_id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments or "{}"}}


def _render_response_format(rf: ResponseFormat) -> ResponseFormatOut:
    if rf.type == "json_object":
        return {"type": "json_object"}
    js: JSONSchemaFormat = {"name": rf.name or "response", "schema": rf.schema if rf.schema is not None else {"type": "object"}}
    if rf.strict is not None:
        js["strict"] = rf.strict
    return {"type": "json_schema", "json_schema": js}


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    refuse(unsupported_controls(req), "openai")
    msgs: list[MessageOut] = []
    if req.system is not None:
        msgs.append({"role": "system", "content": req.system})
    for m in req.messages:
        if m.role == "user":
            msgs.append({"role": "user", "content": _render_content(m.content)})
        elif m.role == "assistant":
            d: AssistantMessageOut = {"role": "assistant", "content": message_text(m) if m.content else None}
            if m.tool_calls:
                d["tool_calls"] = [_call(tc, plain_id(tc.id)) for tc in m.tool_calls]
            msgs.append(d)
        else:
            msgs.append({"role": "tool", "tool_call_id": plain_id(m.tool_call_id or ""),
                         "content": _tool_result_text(m)})
    body: ChatCompletionRequest = {"model": upstream_model, "messages": msgs}
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
        if options is not None and options.legacy_max_tokens:
            body["max_tokens"] = req.max_tokens
        else:
            body["max_completion_tokens"] = req.max_tokens
    if req.stop:
        body["stop"] = list(req.stop)
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stream:
        # Always ask for usage: the gateway meters it even when the client did not ask for it.
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def _tool_def(t: ToolDef) -> FunctionDefOut:
    params = t.parameters if t.parameters is not None else {"type": "object", "properties": {}}
    if t.description is not None:
        return {"name": t.name, "description": t.description, "parameters": params}
    return {"name": t.name, "parameters": params}


# -- the client's own body, same protocol both ways ---------------------------------------------
def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for an OpenAI upstream; a stream gets usage switched on (True) so it
    can be metered, and the usage chunk the client did not ask for is stripped on the way back."""
    inject = req.stream and not req.include_usage
    return with_model(body, req, upstream_model, include_usage=inject), inject
