"""A `ChatRequest` rendered as an Anthropic Messages request (tool ids made Anthropic-safe,
structured output as a forced tool)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import re

import orjson

from adapters.anthropic.request import API_VERSION, DEFAULT_MAX_TOKENS, PATH
from adapters.anthropic.wire import (
    JSON_TOOL,
    Base64Source,
    Block,
    CacheControl,
    DocumentBlock,
    MessageOut,
    MessagesRequest,
    TextBlock,
    TextSource,
    ToolDefOut,
    ToolResultBlock,
    URLSource,
)
from adapters.cache_marks import capped
from adapters.call_ids import plain_id
from adapters.controls import lacking, refuse
from adapters.fields import arguments_object
from adapters.internal import (
    CacheTtl,
    ChatRequest,
    ContentPart,
    DocumentPart,
    Message,
    RenderOptions,
    TextPart,
    ToolDef,
    UpstreamRequest,
    message_text,
)
from adapters.passthrough import with_model
from contracts.errors import ClientError

SUPPORTED_CONTROLS = frozenset({"top_k"})  # Messages has no seed
_DOCUMENT_TYPES = frozenset(("application/pdf", "text/plain"))
# Anthropic's documented tool_use id pattern; other protocols' ids (`functions.f:0`) may not match.
_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def _document_block(p: DocumentPart) -> DocumentBlock:
    if p.media_type not in _DOCUMENT_TYPES or (p.url is not None and p.media_type != "application/pdf"):
        raise ClientError(f"a {p.media_type} document cannot be sent to an Anthropic deployment "
                          "(it takes PDF and plain-text documents)")
    if p.url is not None:
        src: URLSource | TextSource | Base64Source = {"type": "url", "url": p.url}
    elif p.media_type == "text/plain":
        try:
            text = base64.b64decode(p.data or "", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise ClientError("a text/plain document is not base64 UTF-8 text") from None
        src = {"type": "text", "media_type": "text/plain", "data": text}
    else:
        src = {"type": "base64", "media_type": p.media_type, "data": p.data}
    block: DocumentBlock = {"type": "document", "source": src}
    if p.name:
        block["title"] = p.name
    return block


def cache_control(ttl: CacheTtl) -> CacheControl:
    return {"type": "ephemeral", "ttl": "1h"} if ttl == "1h" else {"type": "ephemeral"}


def _text_block(p: TextPart) -> TextBlock:
    block: TextBlock = {"type": "text", "text": p.text}
    if p.cache is not None:
        block["cache_control"] = cache_control(p.cache)
    return block


def _user_blocks(content: tuple[ContentPart, ...]) -> list[Block]:
    out: list[Block] = []
    for p in content:
        block: Block
        if isinstance(p, TextPart):
            block = _text_block(p)
        elif isinstance(p, DocumentPart):
            block = _document_block(p)
        elif p.url is not None:
            block = {"type": "image", "source": {"type": "url", "url": p.url}}
        else:
            block = {"type": "image", "source": {"type": "base64", "media_type": p.media_type or "image/png",
                                                  "data": p.data}}
        if p.cache is not None and block["type"] in ("image", "document"):
            block["cache_control"] = cache_control(p.cache)
        out.append(block)
    return out


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    return lacking(req, SUPPORTED_CONTROLS)


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


def _tool_result(m: Message, ids: _ToolIds) -> ToolResultBlock:
    if all(type(p) is TextPart and p.cache is None for p in m.content):
        content: str | list[Block] = message_text(m)
    else:
        content = _user_blocks(m.content)
    block: ToolResultBlock = {"type": "tool_result", "tool_use_id": ids.result(plain_id(m.tool_call_id or "")), "content": content}
    if m.is_error:
        block["is_error"] = True
    if m.cache is not None:
        block["cache_control"] = cache_control(m.cache)
    return block


def _structured_output(req: ChatRequest, body: MessagesRequest) -> None:
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
    refuse(unsupported_controls(req), "anthropic")
    req = capped(req)
    msgs: list[MessageOut] = []
    ids = _ToolIds()
    for m in req.messages:
        if m.role == "assistant":
            blocks: list[Block] = [_text_block(p) for p in m.content if type(p) is TextPart and p.text]
            for tc in m.tool_calls:
                blocks.append({"type": "tool_use", "id": ids.call(plain_id(tc.id)), "name": tc.name,
                               "input": arguments_object(tc.arguments, name=tc.name)})
            if blocks:
                msgs.append({"role": "assistant", "content": blocks})
            continue
        if m.role == "tool":
            blocks = [_tool_result(m, ids)]
        elif (len(m.content) == 1 and type(m.content[0]) is TextPart and m.content[0].cache is None
              and not (msgs and msgs[-1]["role"] == "user")):
            msgs.append({"role": "user", "content": m.content[0].text})
            continue
        else:
            blocks = _user_blocks(m.content)
        # Tool results and the user text after them share one user turn, as Anthropic requires.
        if msgs and msgs[-1]["role"] == "user":
            prev = msgs[-1]
            content = prev["content"]
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
                prev["content"] = content
            content.extend(blocks)
        else:
            msgs.append({"role": "user", "content": blocks})
    body: MessagesRequest = {"model": upstream_model, "max_tokens": req.max_tokens or DEFAULT_MAX_TOKENS, "messages": msgs}
    if req.system_blocks:
        body["system"] = [_text_block(p) for p in req.system_blocks]
    elif req.system:
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
        choice = body.setdefault("tool_choice", {"type": "auto"})
        if choice["type"] != "none":  # Anthropic takes the flag on auto, any and tool only
            choice["disable_parallel_tool_use"] = True
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


def _tool_def(t: ToolDef) -> ToolDefOut:
    schema = t.parameters if t.parameters is not None else {"type": "object", "properties": {}}
    out: ToolDefOut = ({"name": t.name, "description": t.description, "input_schema": schema}
                       if t.description is not None else {"name": t.name, "input_schema": schema})
    if t.cache is not None:
        out["cache_control"] = cache_control(t.cache)
    return out


# -- the client's own body, same protocol both ways ---------------------------------------------
def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for an Anthropic upstream: streams report usage unasked."""
    return with_model(body, req, upstream_model), False
