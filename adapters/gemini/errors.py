"""Gemini error bodies: rendered with Google's status names, read for the provider's message."""

from __future__ import annotations

import orjson

from adapters.fields import error_message
from adapters.gemini.wire import ErrorBody

_STATUS = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED",
    500: "INTERNAL", 501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    st = _STATUS.get(status)
    if st is None:
        st = "INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL"
    if type == "overloaded_error":
        st = "UNAVAILABLE"
    body: ErrorBody = {"error": {"code": status, "message": message, "status": st}}
    return orjson.dumps(body)


def parse_error(status: int, body: bytes) -> str:
    return error_message(body, status)
