"""Anthropic error bodies: rendered with Anthropic's error types, read for the provider's message."""

from __future__ import annotations

import orjson

from adapters.anthropic.wire import ErrorBody
from adapters.fields import error_message
from contracts.errors import INSUFFICIENT_QUOTA, MODEL_NOT_FOUND, default_type

# Anthropic calls an unknown model what it calls anything else not found, and any 429 a rate limit.
_ANTHROPIC_TYPES = {MODEL_NOT_FOUND: "not_found_error", INSUFFICIENT_QUOTA: "rate_limit_error"}


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    t = type or default_type(status)
    body: ErrorBody = {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(t, t), "message": message}}
    return orjson.dumps(body)


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)
