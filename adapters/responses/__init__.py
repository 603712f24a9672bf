"""OpenAI Responses API (POST /v1/responses) <-> internal format, pure functions.

A client protocol like the three chat APIs: `input` items (messages, `function_call`,
`function_call_output`) become internal turns; the answer goes back as a `response` object with
`message` and `function_call` output items, or as the typed SSE events (`response.created`,
`response.output_item.added`, `response.output_text.delta`, ..., `response.completed`).
The gateway stores nothing, so what needs stored state (`previous_response_id`, `conversation`,
`item_reference`) is a 400, as are controls the internal format cannot carry.
"""

from __future__ import annotations

from adapters.responses.render import passthrough_body, render_request, request_target, unsupported_controls
from adapters.responses.request import (
    CLIENT_AUTH_HEADERS,
    PATH,
    check_query,
    client_api_key,
    parse_error,
    parse_input_tokens,
    parse_request,
    render_error,
)
from adapters.responses.response import parse_response, render_response
from adapters.responses.stream import StreamDecoder, StreamEncoder

__all__ = [
    "PATH", "CLIENT_AUTH_HEADERS", "parse_request", "request_target", "render_request", "parse_response",
    "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error", "client_api_key",
    "check_query", "passthrough_body", "unsupported_controls", "parse_input_tokens",
]
