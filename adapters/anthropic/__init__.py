"""Anthropic Messages <-> internal format (POST /v1/messages), pure functions."""

from __future__ import annotations

from adapters.anthropic.errors import parse_error, render_error
from adapters.anthropic.render import _TOOL_ID as _TOOL_ID
from adapters.anthropic.render import passthrough_body, render_request, request_target, tool_id, unsupported_controls
from adapters.anthropic.request import (
    API_VERSION,
    CLIENT_AUTH_HEADERS,
    DEFAULT_MAX_TOKENS,
    PATH,
    check_query,
    client_api_key,
    parse_count_tokens,
    parse_request,
)
from adapters.anthropic.response import parse_response, render_response
from adapters.anthropic.stream import StreamDecoder, StreamEncoder
from adapters.anthropic.wire import JSON_TOOL

__all__ = [
    "PATH", "API_VERSION", "DEFAULT_MAX_TOKENS", "CLIENT_AUTH_HEADERS", "parse_request", "parse_count_tokens", "request_target",
    "render_request", "parse_response", "render_response", "StreamDecoder", "StreamEncoder", "render_error",
    "parse_error", "client_api_key", "JSON_TOOL", "tool_id", "check_query", "passthrough_body",
    "unsupported_controls",
]
