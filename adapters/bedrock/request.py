"""Internal chat request <-> Bedrock Converse request (the demo upstream parses the latter)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import orjson

from adapters.bedrock.signing import sign
from adapters.bedrock.wire import CachePointBlock, ContentBlock, ConverseRequest, InferenceConfig, ToolConfig
from adapters.bedrock.wire import Message as WireMessage
from adapters.cache_marks import capped, marker_ttl
from adapters.call_ids import plain_id
from adapters.cloud_targets import BedrockTarget
from adapters.controls import lacking, refuse
from adapters.fields import arguments_object, as_object, load_object, opt_list, opt_number, req_str
from adapters.internal import (
    CacheTtl,
    ChatRequest,
    ContentPart,
    DocumentPart,
    ImagePart,
    Message,
    RenderOptions,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDef,
    UpstreamRequest,
    message_text,
)
from adapters.json_types import JSONObject
from adapters.limits import MAX_CHAT_JSON_VALUES, MAX_CONTENT_PARTS, MAX_MESSAGES, MAX_TOOLS, check_count
from contracts.errors import ClientError, UpstreamError

__all__ = ["STREAM_CONTENT_TYPE", "converse_path", "render_request", "request_target", "parse_request", "check_query",
           "passthrough_body"]

STREAM_CONTENT_TYPE = "application/vnd.amazon.eventstream"
_IMAGE_FORMATS = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg", "image/gif": "gif",
                  "image/webp": "webp"}
_DOC_FORMATS = {"application/pdf": "pdf", "text/plain": "txt", "text/csv": "csv", "text/html": "html",
                "text/markdown": "md"}


def converse_path(model_id: str, stream: bool) -> str:
    # A model id or inference-profile ARN may hold ':' and '/': one path segment, percent-encoded.
    return f"/model/{quote(model_id, safe='')}/{'converse-stream' if stream else 'converse'}"


def _target(options: RenderOptions | None) -> BedrockTarget:
    cloud = options.cloud if options is not None else None
    if not isinstance(cloud, BedrockTarget) or cloud.credentials is None:
        raise UpstreamError("bedrock deployment has no region or credentials resolved")
    return cloud


def _b64(data: str, where: str) -> str:
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ClientError(f"{where}: inline data is not base64") from None
    return data


def _user_block(p: ContentPart, where: str) -> ContentBlock:
    if isinstance(p, TextPart):
        return {"text": p.text}
    if p.data is None:  # Bedrock takes inline bytes (or S3), never a URL it would fetch
        raise ClientError(f"{where}: Bedrock takes inline (base64) images and documents, not URLs")
    if type(p) is ImagePart:
        fmt = _IMAGE_FORMATS.get((p.media_type or "").lower())
        if fmt is None:
            raise ClientError(f"{where}: Bedrock takes png, jpeg, gif or webp images, not {p.media_type}")
        return {"image": {"format": fmt, "source": {"bytes": _b64(p.data, where)}}}  # type: ignore[typeddict-item]
    assert type(p) is DocumentPart
    doc = _DOC_FORMATS.get(p.media_type.lower())
    if doc is None:
        raise ClientError(f"{where}: Bedrock has no document format for {p.media_type}")
    name = "".join(c for c in (p.name or "document") if c.isalnum() or c in " -()[]") or "document"
    return {"document": {"format": doc, "name": name, "source": {"bytes": _b64(p.data, where)}}}


def _cache_point(ttl: CacheTtl) -> CachePointBlock:
    return {"type": "default", "ttl": "1h"} if ttl == "1h" else {"type": "default"}


def _marked(blocks: list[ContentBlock], p: ContentPart, block: ContentBlock) -> None:
    """`block`, then a cachePoint right after it when its part carries a marker."""
    blocks.append(block)
    if p.cache is not None:
        blocks.append({"cachePoint": _cache_point(p.cache)})


def _tool_choice(tc: ToolChoice) -> dict[str, Any]:
    if tc.mode == "auto":
        return {"auto": {}}
    if tc.mode == "required":
        return {"any": {}}
    if tc.mode == "tool":
        return {"tool": {"name": tc.name}}
    raise ClientError("tool_choice none is not available on Bedrock: leave the tools out instead")


def _body(req: ChatRequest) -> ConverseRequest:
    if req.response_format is not None:
        raise ClientError("response_format (JSON mode) is not available on this model's Bedrock deployment")
    if req.parallel_tool_calls is False and req.tools:
        raise ClientError("parallel_tool_calls=false is not available on Bedrock")
    req = capped(req)
    msgs: list[WireMessage] = []
    for i, m in enumerate(req.messages):
        where = f"messages[{i}]"
        blocks: list[ContentBlock] = []
        if m.role == "assistant":
            for p in m.content:
                if type(p) is TextPart and p.text:
                    _marked(blocks, p, {"text": p.text})
            blocks += [{"toolUse": {"toolUseId": plain_id(tc.id), "name": tc.name,
                                    "input": arguments_object(tc.arguments, name=tc.name)}} for tc in m.tool_calls]
            role = "assistant"
        elif m.role == "tool":
            blocks = [{"toolResult": {"toolUseId": plain_id(m.tool_call_id or ""),
                                      "content": [{"text": message_text(m)}],
                                      "status": "error" if m.is_error else "success"}}]
            # A cachePoint may not stand inside a toolResult: a marker on any of it follows it.
            mark = m.cache or next((p.cache for p in m.content if p.cache is not None), None)
            if mark is not None:
                blocks.append({"cachePoint": _cache_point(mark)})
            role = "user"
        else:
            for p in m.content:
                _marked(blocks, p, _user_block(p, where))
            role = "user"
        if not blocks:
            continue
        # Bedrock wants strict user/assistant turns: tool results and the text after them share one.
        if msgs and msgs[-1]["role"] == role:
            msgs[-1]["content"].extend(blocks)
        else:
            msgs.append({"role": role, "content": blocks})  # type: ignore[typeddict-item]
    body: ConverseRequest = {"messages": msgs}
    if req.system_blocks:
        body["system"] = []
        for sb in req.system_blocks:
            body["system"].append({"text": sb.text})
            if sb.cache is not None:
                body["system"].append({"cachePoint": _cache_point(sb.cache)})
    elif req.system:
        body["system"] = [{"text": req.system}]
    inference: InferenceConfig = {}
    if req.max_tokens is not None:
        inference["maxTokens"] = req.max_tokens
    if req.temperature is not None:
        inference["temperature"] = min(req.temperature, 1.0)  # Bedrock's range is 0..1
    if req.top_p is not None:
        inference["topP"] = req.top_p
    if req.stop:
        inference["stopSequences"] = list(req.stop)
    if inference:
        body["inferenceConfig"] = inference
    if req.tools:
        tools: ToolConfig = {"tools": []}
        for t in req.tools:
            tools["tools"].append({"toolSpec": _tool_spec(t)})
            if t.cache is not None:
                tools["tools"].append({"cachePoint": _cache_point(t.cache)})
        if req.tool_choice is not None:
            tools["toolChoice"] = _tool_choice(req.tool_choice)
        body["toolConfig"] = tools
    elif req.tool_choice is not None and req.tool_choice.mode != "none":
        raise ClientError("tool_choice needs tools")
    if req.top_k is not None:  # a model field, not Converse's: passed through as the model names it
        body["additionalModelRequestFields"] = {"top_k": req.top_k}
    return body


def _tool_spec(t: ToolDef) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": t.name}
    if t.description:
        spec["description"] = t.description
    spec["inputSchema"] = {"json": t.parameters if t.parameters is not None else {"type": "object", "properties": {}}}
    return spec


# top_k rides in additionalModelRequestFields; Converse has no seed.
SUPPORTED_CONTROLS = frozenset({"top_k"})


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    return lacking(req, SUPPORTED_CONTROLS)


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> tuple[str, dict[str, str]]:
    """Bedrock requests are always rendered (and signed over their body): no passthrough target."""
    raise UpstreamError("a bedrock request is rendered and signed, never passed through")


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    """The Converse(Stream) request, SigV4-signed for the deployment's region and Host."""
    refuse(unsupported_controls(req), "bedrock")
    target = _target(options)
    body = orjson.dumps(_body(req))
    path = converse_path(upstream_model, req.stream)
    headers = {"content-type": "application/json",
               "accept": STREAM_CONTENT_TYPE if req.stream else "application/json"}
    assert target.credentials is not None
    headers.update(sign(target.host, path, body, headers, target.region, target.credentials))
    return UpstreamRequest(path, headers, body)


# ---- the other way: a Converse request in (the demo upstream; table tests) ----------------------


def _parse_cache_point(block: JSONObject, where: str) -> CacheTtl | None:
    """A `cachePoint` block's TTL, or None when `block` is not one."""
    if "cachePoint" not in block:
        return None
    cp = as_object(block["cachePoint"], f"{where}.cachePoint")
    if cp.get("type") != "default":
        raise ClientError(f"{where}.cachePoint.type must be 'default'")
    return marker_ttl(cp, f"{where}.cachePoint")


def _parse_block(b: object, where: str) -> ContentPart | ToolCall | Message:
    block = as_object(b, where)
    if type(block.get("text")) is str:
        return TextPart(block["text"])
    if "image" in block:
        img = as_object(block["image"], f"{where}.image")
        src = as_object(img.get("source"), f"{where}.image.source")
        return ImagePart(f"image/{req_str(img, 'format', where + '.image')}", req_str(src, "bytes", where))
    if "document" in block:
        doc = as_object(block["document"], f"{where}.document")
        src = as_object(doc.get("source"), f"{where}.document.source")
        fmt = req_str(doc, "format", where)
        media = next((k for k, v in _DOC_FORMATS.items() if v == fmt), f"application/{fmt}")
        return DocumentPart(media, req_str(src, "bytes", where), name=doc.get("name"))
    if "toolUse" in block:
        tu = as_object(block["toolUse"], f"{where}.toolUse")
        return ToolCall(req_str(tu, "toolUseId", where), req_str(tu, "name", where),
                        orjson.dumps(tu.get("input") or {}).decode())
    if "toolResult" in block:
        tr = as_object(block["toolResult"], f"{where}.toolResult")
        parts = opt_list(tr, "content", where)
        text = "".join(p["text"] if type(p.get("text")) is str else orjson.dumps(p.get("json")).decode()
                       for p in parts if type(p) is dict)
        return Message("tool", (TextPart(text),), tool_call_id=req_str(tr, "toolUseId", where),
                       is_error=tr.get("status") == "error")
    raise ClientError(f"{where}: unsupported content block")


def parse_request(body: bytes, *, path_model: str | None = None, stream_hint: bool = False) -> ChatRequest:
    """A Converse request (model from the path, stream from `/converse-stream`)."""
    obj = load_object(body, max_values=MAX_CHAT_JSON_VALUES)
    if not path_model:
        raise ClientError("the model id is part of the path")
    raw = opt_list(obj, "messages", "body")
    check_count(raw, MAX_MESSAGES, "messages")
    msgs: list[Message] = []
    for i, m in enumerate(raw):
        m = as_object(m, f"messages[{i}]")
        role = m.get("role")
        if role not in ("user", "assistant"):
            raise ClientError(f"messages[{i}].role must be user or assistant")
        blocks = opt_list(m, "content", f"messages[{i}]")
        check_count(blocks, MAX_CONTENT_PARTS, f"messages[{i}].content")
        parts: list[ContentPart] = []
        calls: list[ToolCall] = []
        last: object = None  # what a cachePoint marks: the block before it
        for j, b in enumerate(blocks):
            bw = f"messages[{i}].content[{j}]"
            ttl = _parse_cache_point(as_object(b, bw), bw)
            if ttl is not None:
                if type(last) is Message:
                    msgs[-1] = replace(msgs[-1], cache=ttl)
                elif last is not None and type(last) is not ToolCall:
                    parts[-1] = replace(parts[-1], cache=ttl)
                last = None
                continue
            got = last = _parse_block(b, bw)
            if type(got) is Message:
                msgs.append(got)
            elif type(got) is ToolCall:
                calls.append(got)
            else:
                parts.append(got)  # type: ignore[arg-type]
        if parts or calls:
            msgs.append(Message(role, tuple(parts), tuple(calls)))
    if not msgs:
        raise ClientError("messages must not be empty")
    system_blocks: list[TextPart] = []
    for k, sb in enumerate(opt_list(obj, "system", "body")):
        sb = as_object(sb, f"system[{k}]")
        ttl = _parse_cache_point(sb, f"system[{k}]")
        if ttl is not None and system_blocks:
            system_blocks[-1] = replace(system_blocks[-1], cache=ttl)
        elif type(sb.get("text")) is str:
            system_blocks.append(TextPart(sb["text"]))
    system = "".join(p.text for p in system_blocks)
    inf = as_object(obj.get("inferenceConfig") or {}, "inferenceConfig")
    tc = as_object(obj.get("toolConfig") or {}, "toolConfig")
    tools: list[ToolDef] = []
    for k, t in enumerate(opt_list(tc, "tools", "toolConfig")):
        tw = f"toolConfig.tools[{k}]"
        ttl = _parse_cache_point(as_object(t, tw), tw)
        if ttl is not None:
            if tools:
                tools[-1] = replace(tools[-1], cache=ttl)
            continue
        spec = as_object(as_object(t, tw).get("toolSpec"), f"{tw}.toolSpec")
        schema = as_object(spec.get("inputSchema") or {"json": None}, "inputSchema").get("json")
        tools.append(ToolDef(req_str(spec, "name", "toolSpec"), spec.get("description"), schema))
    check_count(tools, MAX_TOOLS, "tools")
    max_tokens = inf.get("maxTokens")
    return ChatRequest(
        model=path_model, messages=tuple(msgs), system=system or None, tools=tuple(tools),
        system_blocks=tuple(system_blocks) if any(p.cache is not None for p in system_blocks) else (),
        temperature=opt_number(inf, "temperature", "inferenceConfig", 0.0, 1.0),
        top_p=opt_number(inf, "topP", "inferenceConfig", 0.0, 1.0),
        max_tokens=max_tokens if type(max_tokens) is int and max_tokens > 0 else None,
        stop=tuple(s for s in opt_list(inf, "stopSequences", "inferenceConfig") if type(s) is str),
        stream=stream_hint,
    )


# -- the request as a caller sent it (Bedrock is an upstream protocol only: no caller speaks it) ---
def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Nothing in the query string changes a Converse request (streaming is its own path)."""


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """A Converse body as sent: the model id travels in the path, and ConverseStream reports usage unasked."""
    return body, False
