"""The one place an error becomes a reply: any `ModelyardError` in the caller's protocol's shape."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from adapters import kserve_grpc
from adapters.error_bodies import ERROR_RENDERERS, render_error_body
from contracts.errors import ModelyardError
from extproc import messages as msg

__all__ = ["ERROR_RENDERERS", "GRPC_STATUS", "error_response", "render_error_body"]
# Callers answered with a gRPC status (Envoy sends a gRPC caller's local reply trailers-only): the
# code for the error's HTTP status, the body as grpc-message.
GRPC_STATUS: dict[str, Callable[[int], int]] = {"kserve-grpc": kserve_grpc.grpc_code}


def error_response(protocol: str, e: ModelyardError, extra: Iterable[tuple[str, str]] = ()) -> msg.ProcessingResponse:
    body = render_error_body(protocol, e.status, e.message, e.type)
    grpc_code = GRPC_STATUS.get(protocol)
    if grpc_code is not None:
        r = msg.immediate(200, body, [*e.headers, *extra], details=f"modelyard_{e.type}")
        r.immediate_response.grpc_status.status = grpc_code(e.status)
        return r
    return msg.immediate(e.status, body, [("content-type", "application/json"), *e.headers, *extra],
                         details=f"modelyard_{e.type}")
