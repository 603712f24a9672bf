"""Vertex AI requests: Gemini's or Anthropic's body at Vertex's publisher paths, with a bearer token.

Gemini: `.../publishers/google/models/{model}:generateContent` (`:streamGenerateContent?alt=sse`).
Claude: `.../publishers/anthropic/models/{model}:rawPredict` (`:streamRawPredict`), the model in
the path rather than the body, and `anthropic_version` in the body rather than a header.
"""

from __future__ import annotations

from urllib.parse import quote

import orjson

from adapters import anthropic, gemini
from adapters.cloud_targets import VertexTarget
from adapters.internal import ChatRequest, RenderOptions, UpstreamRequest
from contracts.errors import UpstreamError

__all__ = ["ANTHROPIC_VERSION", "model_path", "request_target", "render_request", "unsupported_controls"]

ANTHROPIC_VERSION = "vertex-2023-10-16"


def model_path(target: VertexTarget, model: str, stream: bool) -> str:
    base = (f"/v1/projects/{quote(target.project, safe='')}/locations/{quote(target.location, safe='')}"
            f"/publishers/{target.publisher}/models/{quote(model, safe='@.-_~')}")
    if target.publisher == "anthropic":
        return base + (":streamRawPredict" if stream else ":rawPredict")
    return base + (":streamGenerateContent?alt=sse" if stream else ":generateContent")


def _target(options: RenderOptions | None) -> VertexTarget:
    cloud = options.cloud if options is not None else None
    if not isinstance(cloud, VertexTarget):
        raise UpstreamError("vertex deployment has no `vertex:` settings")
    return cloud


def _headers(credential: str | None) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if credential:
        headers["authorization"] = "Bearer " + credential
    return headers


def request_target(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> tuple[str, dict[str, str]]:
    return model_path(_target(options), upstream_model, req.stream), _headers(credential)


def unsupported_controls(req: ChatRequest, options: RenderOptions | None = None) -> tuple[str, ...]:
    """The publisher's body decides: Claude's Messages or Gemini's generateContent."""
    if _target(options).publisher == "anthropic":
        return anthropic.unsupported_controls(req)
    return gemini.unsupported_controls(req)


def render_request(req: ChatRequest, *, upstream_model: str, credential: str | None,
                   options: RenderOptions | None = None) -> UpstreamRequest:
    target = _target(options)
    if target.publisher == "anthropic":
        body = orjson.loads(anthropic.render_request(req, upstream_model=upstream_model, credential=None).body)
        del body["model"]  # the path names it; Vertex refuses it in the body
        out = orjson.dumps({"anthropic_version": ANTHROPIC_VERSION, **body})
    else:
        out = gemini.render_request(req, upstream_model=upstream_model, credential=None, options=options).body
    return UpstreamRequest(model_path(target, upstream_model, req.stream), _headers(credential), out)
