"""Parse and render by wire shape or deployment protocol (what the flow and the demo upstreams call)."""

from __future__ import annotations

from adapters.embeddings.gemini import (
    parse_gemini_request,
    parse_gemini_response,
    render_gemini_request,
    render_gemini_response,
)
from adapters.embeddings.openai import (
    parse_openai_request,
    parse_openai_response,
    render_openai_request,
    render_openai_response,
)
from adapters.embeddings.wire import EmbeddingRequest, EmbeddingResponse, Shape
from adapters.fields import bad_upstream
from adapters.internal import UpstreamRequest
from contracts.errors import ClientError, UpstreamError


def parse_request(shape: Shape, body: bytes, *, path_model: str | None = None) -> EmbeddingRequest:
    if shape == "openai":
        return parse_openai_request(body)
    if path_model is None:
        raise ClientError("model is required in the path /v1beta/models/{model}:embedContent")
    return parse_gemini_request(body, path_model=path_model, batch=shape == "gemini-batch")


def render_request(protocol: str, req: EmbeddingRequest, *, upstream_model: str,
                   credential: str | None) -> UpstreamRequest:
    """The upstream request for a deployment speaking `protocol` (openai or gemini)."""
    if protocol == "openai":
        return render_openai_request(req, upstream_model=upstream_model, credential=credential)
    if protocol == "gemini":
        return render_gemini_request(req, upstream_model=upstream_model, credential=credential)
    # Config load refuses such a deployment (EMBEDDING_PROTOCOLS); reaching here is a bug upstream of us.
    raise UpstreamError(f"a {protocol} deployment cannot serve embeddings")


def parse_response(protocol: str, body: bytes) -> EmbeddingResponse:
    return parse_openai_response(body) if protocol == "openai" else parse_gemini_response(body)


def render_response(shape: Shape, resp: EmbeddingResponse, *, model: str, req: EmbeddingRequest) -> bytes:
    if len(resp.vectors) != len(req.inputs):
        raise bad_upstream(f"{len(resp.vectors)} embeddings for {len(req.inputs)} inputs")
    if shape == "openai":
        return render_openai_response(resp, model=model, req=req)
    return render_gemini_response(resp, batch=shape == "gemini-batch")


# -- same protocol both ways -----------------------------------------------------------------------
def passes_through(shape: Shape, protocol: str) -> bool:
    """An OpenAI caller of an OpenAI upstream keeps its own bytes both ways (only the model swapped)."""
    return shape == "openai" and protocol == "openai"
