"""Gemini generateContent <-> internal format, pure functions.

POST /v1beta/models/{model}:generateContent and :streamGenerateContent?alt=sse. Gemini has no
tool-call ids: parsing a request synthesizes stable `call_<n>` ids (n counts calls through the
conversation) and pairs each functionResponse with the oldest unanswered call of the same name;
a response's calls get ids unique across conversations (`call_ids.new_call_id`).
"""

from __future__ import annotations

from adapters.gemini.errors import parse_error, render_error
from adapters.gemini.render import (
    SKIP_SIGNATURE,
    passthrough_body,
    render_request,
    request_path,
    request_target,
    unsupported_controls,
)
from adapters.gemini.request import CLIENT_AUTH_HEADERS, check_query, client_api_key, parse_count_tokens, parse_request
from adapters.gemini.response import parse_response, render_response
from adapters.gemini.schema import gemini_schema, json_schema
from adapters.gemini.stream import StreamDecoder, StreamEncoder

__all__ = [
    "CLIENT_AUTH_HEADERS", "parse_request", "parse_count_tokens", "request_target", "render_request", "parse_response", "render_response",
    "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key", "request_path",
    "SKIP_SIGNATURE", "gemini_schema", "json_schema", "check_query", "passthrough_body",
    "unsupported_controls",
]
