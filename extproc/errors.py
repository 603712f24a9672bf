"""The one place an error becomes a reply: any `ModelyardError` in the caller's protocol's shape."""

from __future__ import annotations

from collections.abc import Iterable

from adapters import kserve
from adapters.registry import PROTOCOLS
from extproc import messages as msg
from modelyard.errors import ModelyardError


def render_error_body(protocol: str, status: int, message: str, type_: str) -> bytes:
    if protocol == "kserve":
        return kserve.render_error(status, message)
    return PROTOCOLS.get(protocol, PROTOCOLS["openai"]).render_error(status, message, type_)


def error_response(protocol: str, e: ModelyardError, extra: Iterable[tuple[str, str]] = ()) -> msg.ProcessingResponse:
    body = render_error_body(protocol, e.status, e.message, e.type)
    return msg.immediate(e.status, body, [("content-type", "application/json"), *e.headers, *extra],
                         details=f"modelyard_{e.type}")
