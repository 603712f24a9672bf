"""OpenAI error bodies: rendered with OpenAI's types and codes, read for the provider's message."""

from __future__ import annotations

import orjson

from adapters.fields import error_message
from adapters.openai.wire import ErrorBody
from contracts.errors import INSUFFICIENT_QUOTA, MODEL_NOT_FOUND, default_type

# OpenAI answers every 4xx as invalid_request_error but auth and limits; model_not_found is a code there.
_OPENAI_TYPES = {"api_error": "server_error", "overloaded_error": "server_error", "timeout_error": "server_error",
                 "not_found_error": "invalid_request_error", MODEL_NOT_FOUND: "invalid_request_error"}
_OPENAI_CODES = {401: "invalid_api_key", 429: "rate_limit_exceeded"}
# Types whose code is their own name (an exhausted quota is `insufficient_quota` in both, as OpenAI answers).
_OWN_CODES = (MODEL_NOT_FOUND, INSUFFICIENT_QUOTA)


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    t = type or default_type(status)
    body: ErrorBody = {"error": {
        "message": message, "type": _OPENAI_TYPES.get(t, t), "param": None,
        "code": t if t in _OWN_CODES else _OPENAI_CODES.get(status),
    }}
    return orjson.dumps(body)


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)
