"""Errors the gateway answers itself, rendered in the caller's own protocol shape."""

from __future__ import annotations

from collections.abc import Iterable

from extproc import messages as msg


class GatewayError(Exception):
    """A request the gateway refuses: status, message and the protocol-neutral error type."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 headers: Iterable[tuple[str, str]] = ()):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.headers = list(headers)


def render_error_body(protocol: str, status: int, message: str, type_: str) -> bytes:
    if protocol == "kserve":
        from adapters import kserve

        return kserve.render_error(status, message)
    from adapters.registry import PROTOCOLS

    return PROTOCOLS.get(protocol, PROTOCOLS["openai"]).render_error(status, message, type_)


def error_response(protocol: str, e: GatewayError, extra: Iterable[tuple[str, str]] = ()) -> msg.ProcessingResponse:
    body = render_error_body(protocol, e.status, e.message, e.type)
    return msg.immediate(e.status, body, [("content-type", "application/json"), *e.headers, *extra],
                         details=f"modelyard_{e.type}")
