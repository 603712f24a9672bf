"""OpenAI Chat Completions <-> internal format (POST /v1/chat/completions), pure functions."""

from __future__ import annotations

from adapters.openai.errors import parse_error, render_error
from adapters.openai.render import passthrough_body, render_request, request_target, unsupported_controls
from adapters.openai.request import CLIENT_AUTH_HEADERS, PATH, check_query, client_api_key, parse_request
from adapters.openai.response import parse_response, render_response
from adapters.openai.stream import StreamDecoder, StreamEncoder

__all__ = [
    "PATH", "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response",
    "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key",
    "check_query", "passthrough_body", "unsupported_controls",
]
