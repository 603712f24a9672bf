"""A `ChatRequest` rendered as a Completions request, and the client's own body passed through."""

from __future__ import annotations

import orjson

from adapters.completions.request import PATH
from adapters.completions.wire import CompletionRequest
from adapters.controls import lacking, refuse
from adapters.internal import ChatRequest, RenderOptions, TextPart, UpstreamRequest
from adapters.passthrough import with_model
from contracts.errors import ClientError

SUPPORTED_CONTROLS = frozenset({"seed", "top_k"})  # every server that speaks this API is OpenAI-compatible


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    return lacking(req, SUPPORTED_CONTROLS)


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None) -> tuple[str, dict[str, str]]:
    """Path and headers of the upstream request, without rendering its body (passthrough)."""
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return PATH, headers


def _prompt(req: ChatRequest) -> str:
    """The one text a completion continues: a request of one user turn in plain text, nothing else."""
    if req.system is not None or req.tools or len(req.messages) != 1 or req.messages[0].role != "user" \
            or any(type(p) is not TextPart for p in req.messages[0].content) or req.response_format is not None:
        raise ClientError("a Completions deployment takes one plain-text prompt: no system prompt, turns, "
                          "tools, images or response_format")
    return "".join(p.text for p in req.messages[0].content if type(p) is TextPart)


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    refuse(unsupported_controls(req), "completions")
    body: CompletionRequest = {"model": upstream_model, "prompt": _prompt(req)}
    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.top_k is not None:
        body["top_k"] = req.top_k
    if req.stop:
        body["stop"] = list(req.stop)
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stream:  # usage always: the gateway meters it
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    path, headers = request_target(req, upstream_model=upstream_model, credential=credential)
    return UpstreamRequest(path, headers, orjson.dumps(body))


def passthrough_body(body: bytes, req: ChatRequest, *, upstream_model: str) -> tuple[bytes, bool]:
    """The client's own body for a server that speaks Completions; a stream gets usage switched on
    (True) to be metered, and that usage chunk is stripped on the way back."""
    inject = req.stream and not req.include_usage
    return with_model(body, req, upstream_model, include_usage=inject), inject
