"""The one error tree: every error the gateway answers with carries its HTTP status here.

Each layer (adapters, kernels, routing, the request path) raises the class that says whose fault it
is; `extproc/errors.py` turns any of them into the caller's protocol, in one place. This module is
a leaf: it imports nothing of Modelyard's, so every layer may import it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

__all__ = [
    "BudgetExhausted",
    "ClientError",
    "ConfigError",
    "INSUFFICIENT_QUOTA",
    "MODEL_NOT_FOUND",
    "ModelyardError",
    "NotFound",
    "UnknownModel",
    "Unavailable",
    "UpstreamError",
    "default_type",
]

# Canonical error types (Anthropic/OpenAI vocabulary); each protocol maps them to its own shape.
DEFAULT_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}

# A 404 about a model, not a URL or an id: OpenAI says `code: model_not_found` for it and only for it.
MODEL_NOT_FOUND = "model_not_found"
# A spent budget: OpenAI answers exhausted quota with this type and code; other protocols say 429.
INSUFFICIENT_QUOTA = "insufficient_quota"


def answer_too_large(buffer_limit_bytes: int) -> str:
    """What a caller hears when an answer without a content-length outgrew the gateway's buffer (Envoy's
    local reply, controlplane.local_replies, or the extproc's own on a duplex body, extproc/duplex.py)."""
    return (f"the upstream's answer came without a content-length and outgrew the gateway's buffer "
            f"({buffer_limit_bytes} bytes, the environment's buffer_limit_bytes): ask for less")


def default_type(status: int) -> str:
    """The canonical error type for an HTTP status."""
    if status in DEFAULT_TYPES:
        return DEFAULT_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


class ModelyardError(Exception):
    """An error the gateway answers with: message first, everything else by keyword."""

    default_status = 500
    error_type: str | None = None  # a subclass's own type, where the status alone does not say it

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,
                 headers: Iterable[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.status = self.default_status if status is None else status
        self.type = type or self.error_type or default_type(self.status)
        self.headers = list(headers)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, status={self.status}, type={self.type!r})"


class ClientError(ModelyardError):
    """The caller's fault (4xx): bad input, no key, unknown model, over a limit."""

    default_status = 400


class NotFound(ClientError):
    """An unknown model or URL; unknown and forbidden look the same so keys cannot probe."""

    default_status = 404


class UnknownModel(NotFound):
    """A model the caller named that does not exist or is not theirs (404, `model_not_found`)."""

    error_type = MODEL_NOT_FOUND


class BudgetExhausted(ClientError):
    """A key's or tenant's budget is spent for its period (429, `insufficient_quota`); `retry-after`
    is the seconds until the period resets."""

    default_status = 429
    error_type = INSUFFICIENT_QUOTA

    def __init__(self, message: str, *, retry_after_s: int, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message, headers=[*headers, ("retry-after", str(max(1, retry_after_s)))])


class UpstreamError(ModelyardError):
    """The upstream's fault (502, 504 on a timeout): a failure or an answer we cannot read."""

    default_status = 502


class Unavailable(ModelyardError):
    """No capacity now (503); `retry_after_s`, when known, becomes a `retry-after` header."""

    default_status = 503

    def __init__(self, message: str, *, retry_after_s: float | None = None, status: int | None = None,
                 type: str | None = None, headers: Iterable[tuple[str, str]] = ()) -> None:
        self.retry_after_s = retry_after_s
        if retry_after_s:
            headers = [*headers, ("retry-after", str(max(1, math.ceil(retry_after_s))))]
        super().__init__(message, status=status, type=type, headers=headers)


class ConfigError(ModelyardError, ValueError):
    """A config that cannot be used; the message names the key path and what was expected."""

    default_status = 500
