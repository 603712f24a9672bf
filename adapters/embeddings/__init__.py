"""Embeddings: OpenAI `POST /v1/embeddings` <-> Gemini `:embedContent` / `:batchEmbedContents`,
pure functions over bytes through one internal request and response.

Vectors travel as one float32 NumPy matrix (rows = inputs): OpenAI's embeddings are float32
(what its base64 encoding carries), parsing base64 is a `frombuffer`, and orjson renders the
matrix without a Python float per value. Upstreams are asked for base64 where they have it.
"""

from __future__ import annotations

from adapters.embeddings.gemini import (
    parse_gemini_request,
    parse_gemini_response,
    render_gemini_request,
    render_gemini_response,
)
from adapters.embeddings.openai import (
    openai_target,
    openai_usage,
    parse_openai_request,
    parse_openai_response,
    passthrough_request,
    render_openai_request,
    render_openai_response,
)
from adapters.embeddings.shapes import parse_request, parse_response, passes_through, render_request, render_response
from adapters.embeddings.wire import (
    EMBEDDING_PROTOCOLS,
    MAX_EMBED_JSON_VALUES,
    MAX_INPUTS,
    OPENAI_PATH,
    EmbeddingRequest,
    EmbeddingResponse,
    EmbeddingRoute,
    EncodingFormat,
    Shape,
    estimate_tokens,
    longest_input_tokens,
    match_path,
)

__all__ = [
    "OPENAI_PATH", "EMBEDDING_PROTOCOLS", "EmbeddingRequest", "EmbeddingResponse", "EmbeddingRoute", "match_path",
    "estimate_tokens", "longest_input_tokens", "parse_openai_request", "openai_target", "render_openai_request",
    "parse_openai_response", "render_openai_response", "parse_gemini_request", "render_gemini_request",
    "parse_gemini_response", "render_gemini_response", "parse_request", "render_request", "parse_response",
    "render_response", "openai_usage", "Shape", "EncodingFormat", "MAX_INPUTS", "MAX_EMBED_JSON_VALUES",
    "passes_through", "passthrough_request",
]
