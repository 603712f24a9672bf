"""A `ChatRequest` rendered as a Responses API request (`input` items, tools, text format)."""

from __future__ import annotations

from typing import Literal

import orjson

from adapters.call_ids import plain_id
from adapters.controls import lacking, refuse
from adapters.internal import (
    ChatRequest,
    ContentPart,
    DocumentPart,
    RenderOptions,
    ResponseFormat,
    TextPart,
    ToolChoice,
    ToolDef,
    UpstreamRequest,
    message_text,
)
from adapters.passthrough import with_model
from adapters.responses.request import PATH
from adapters.responses.wire import (
    FunctionTool,
    InputFile,
    InputItem,
    InputPart,
    NamedFunctionChoice,
    ResponsesRequest,
    TextConfig,
    TextFormat,
)
from contracts.errors import ClientError


def _text_config(rf: ResponseFormat | None) -> TextConfig:
    if rf is None:
        return {"format": {"type": "text"}}
    if rf.type == "json_object":
        return {"format": {"type": "json_object"}}
    fmt: TextFormat = {"type": "json_schema", "name": rf.name or "response",
                 "schema": rf.schema if rf.schema is not None else {"type": "object"}}
    if rf.strict is not None:
        fmt["strict"] = rf.strict
    return {"format": fmt}


def _input_items(req: ChatRequest) -> list[InputItem]:
    items: list[InputItem] = []
    for m in req.messages:
        if m.role == "tool":
            # A text result is a string; one with images or files keeps them as input parts.
            only_text = all(isinstance(p, TextPart) for p in m.content)
            items.append({"type": "function_call_output", "call_id": plain_id(m.tool_call_id or ""),
                          "output": message_text(m) if only_text else _parts(m.content, "input_text")})
            continue
        if m.content:
            kind: Literal["input_text", "output_text"] = "input_text" if m.role == "user" else "output_text"
            items.append({"type": "message", "role": m.role, "content": _parts(m.content, kind)})
        for tc in m.tool_calls:
            items.append({"type": "function_call", "call_id": plain_id(tc.id), "name": tc.name,
                          "arguments": tc.arguments or "{}"})
    return items


def _parts(content: tuple[ContentPart, ...], kind: Literal["input_text", "output_text"]) -> list[InputPart]:
    parts: list[InputPart] = []
    for p in content:
        if isinstance(p, TextPart):
            parts.append({"type": kind, "text": p.text})
        elif isinstance(p, DocumentPart):
            parts.append(_file_part(p))
        else:
            url = p.url if p.url is not None else f"data:{p.media_type or 'image/png'};base64,{p.data}"
            parts.append({"type": "input_image", "image_url": url})
    return parts


def _file_part(p: DocumentPart) -> InputFile:
    d: InputFile = {"type": "input_file"}
    if p.data is not None:
        d["file_data"] = f"data:{p.media_type};base64,{p.data}"
    else:
        d["file_url"] = p.url
    if p.name:
        d["filename"] = p.name
    return d


def _tool_defs(tools: tuple[ToolDef, ...]) -> list[FunctionTool]:
    out = []
    for t in tools:
        d: FunctionTool = {"type": "function", "name": t.name,
                   "parameters": t.parameters if t.parameters is not None else {"type": "object", "properties": {}}}
        if t.description is not None:
            d["description"] = t.description
        out.append(d)
    return out


def _tool_choice_out(tc: ToolChoice | None) -> str | NamedFunctionChoice:
    if tc is None:
        return "auto"
    return {"type": "function", "name": tc.name} if tc.mode == "tool" else tc.mode


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    """The Responses API has neither top_k nor seed."""
    return lacking(req, frozenset())


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return PATH, headers


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    refuse(unsupported_controls(req), "responses")
    body: ResponsesRequest = {"model": upstream_model, "input": _input_items(req), "store": False}
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
    if req.stop:
        raise ClientError("stop sequences cannot be sent to a Responses API upstream (it has no such control)")
    if req.parallel_tool_calls is not None and req.tools:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.response_format is not None:
        body["text"] = _text_config(req.response_format)
    if req.stream:
        body["stream"] = True
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


# -- the client's own body, same protocol both ways ---------------------------------------------
def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for a Responses upstream: its streams report usage unasked."""
    return with_model(body, req, upstream_model), False
