"""Google Vertex AI (`protocol: vertex`): Gemini (`publisher: google`) and Claude (`publisher:
anthropic`) at Vertex's project/location/publisher paths, authenticated with OAuth2 access tokens
(google-auth, refreshed by the extproc off the event loop). What maps and what is refused:
docs/protocols.md."""

from __future__ import annotations

from collections.abc import Mapping

from adapters import gemini
from adapters.vertex.request import ANTHROPIC_VERSION, model_path, render_request, request_target, unsupported_controls
from adapters.vertex.response import is_gemini, parse_error, parse_response, render_error, render_response
from adapters.vertex.stream import StreamDecoder, StreamEncoder

__all__ = [
    "ANTHROPIC_VERSION", "CLIENT_AUTH_HEADERS", "model_path", "parse_request", "request_target", "render_request",
    "parse_response", "render_response", "is_gemini", "StreamDecoder", "StreamEncoder", "render_error",
    "parse_error", "client_api_key", "check_query", "passthrough_body", "unsupported_controls",
]

CLIENT_AUTH_HEADERS: tuple[str, ...] = ()  # bearer tokens ride in `authorization`, stripped for every upstream

parse_request = gemini.parse_request
# A same-shape body is Gemini's, sent as it is: the model travels in the path.
passthrough_body = gemini.passthrough_body


def check_query(query: Mapping[str, str], *, stream_hint: bool) -> None:
    """Vertex is an upstream protocol only: no caller's query string is read (the gateway asks Vertex
    for `alt=sse` itself when it streams)."""


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """Vertex is an upstream protocol only: no caller authenticates to the gateway with it."""
    return None
