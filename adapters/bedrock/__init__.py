"""AWS Bedrock (`protocol: bedrock`): the Converse and ConverseStream APIs, SigV4-signed.

`POST /model/{modelId}/converse` answers JSON; `/converse-stream` answers binary
`application/vnd.amazon.eventstream` frames, decoded incrementally (adapters.bedrock.eventstream).
What maps and what is refused: docs/protocols.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.bedrock.request import (
    STREAM_CONTENT_TYPE,
    check_query,
    converse_path,
    parse_request,
    passthrough_body,
    render_request,
    request_target,
    unsupported_controls,
)
from adapters.bedrock.response import parse_error, parse_response, render_error, render_response
from adapters.bedrock.stream import StreamDecoder, StreamEncoder

__all__ = [
    "CLIENT_AUTH_HEADERS", "STREAM_CONTENT_TYPE", "converse_path", "parse_request", "request_target",
    "render_request", "parse_response", "render_response", "StreamDecoder", "StreamEncoder", "render_error",
    "parse_error", "client_api_key", "check_query", "passthrough_body",
    "unsupported_controls",
]

# A caller's AWS session token must not travel on to any upstream.
CLIENT_AUTH_HEADERS: tuple[str, ...] = ("x-amz-security-token",)


def client_api_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """Bedrock is an upstream protocol only: no caller authenticates to the gateway with SigV4."""
    return None
