"""The one place an error becomes a reply: any `ModelyardError` in the caller's protocol's shape."""

from __future__ import annotations

from collections.abc import Iterable

from adapters import kserve, kserve_grpc
from adapters.registry import PROTOCOLS
from extproc import messages as msg
from modelyard.errors import ModelyardError


def render_error_body(protocol: str, status: int, message: str, type_: str) -> bytes:
    if protocol == "kserve":
        return kserve.render_error(status, message)
    return PROTOCOLS.get(protocol, PROTOCOLS["openai"]).render_error(status, message, type_)


def error_response(protocol: str, e: ModelyardError, extra: Iterable[tuple[str, str]] = ()) -> msg.ProcessingResponse:
    if protocol == "kserve-grpc":
        # Envoy answers a gRPC caller's local reply trailers-only: this status, the body as grpc-message.
        r = msg.immediate(200, e.message.encode(), [*e.headers, *extra], details=f"modelyard_{e.type}")
        r.immediate_response.grpc_status.status = kserve_grpc.grpc_code(e.status)
        return r
    body = render_error_body(protocol, e.status, e.message, e.type)
    return msg.immediate(e.status, body, [("content-type", "application/json"), *e.headers, *extra],
                         details=f"modelyard_{e.type}")
