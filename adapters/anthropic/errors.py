"""Anthropic error bodies: rendered with Anthropic's error types, read for the provider's message."""

from __future__ import annotations

import orjson

from adapters.anthropic.wire import ErrorBody
from adapters.fields import error_message
from modelyard.errors import MODEL_NOT_FOUND, default_type


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    t = type or default_type(status)
    # Anthropic calls an unknown model what it calls anything else not found.
    body: ErrorBody = {"type": "error", "error": {"type": "not_found_error" if t == MODEL_NOT_FOUND else t,
                                                  "message": message}}
    return orjson.dumps(body)


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)
