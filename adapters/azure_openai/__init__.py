"""Azure OpenAI (`protocol: azure-openai`): OpenAI's chat wire format at Azure's paths and auth.

`POST /openai/deployments/{deployment}/chat/completions?api-version=...` with an `api-key` header
or an Entra ID bearer token; the bodies are OpenAI's (reused from `adapters.openai`), plus Azure's
content-filter annotations and error shape (docs/protocols.md).
"""

from __future__ import annotations

from adapters.azure_openai.request import (
    CLIENT_AUTH_HEADERS,
    check_query,
    client_api_key,
    deployment_path,
    parse_request,
    passthrough_body,
    render_request,
    request_target,
    unsupported_controls,
)
from adapters.azure_openai.response import parse_error, parse_response, render_error, render_response
from adapters.azure_openai.stream import StreamDecoder, StreamEncoder

__all__ = [
    "CLIENT_AUTH_HEADERS", "deployment_path", "parse_request", "request_target", "render_request",
    "parse_response", "render_response", "StreamDecoder", "StreamEncoder", "render_error", "parse_error",
    "client_api_key", "check_query", "passthrough_body", "unsupported_controls",
]
