"""Every caller protocol's error body behind one signature: the request path answers errors with it,
and the control plane renders Envoy's own replies (no extproc reachable) with the same bodies."""

from __future__ import annotations

from typing import Protocol

from adapters import kserve, kserve_grpc, mcp
from adapters.registry import PROTOCOLS

__all__ = ["ERROR_RENDERERS", "ErrorRenderer", "render_error_body"]


class ErrorRenderer(Protocol):
    def __call__(self, status: int, message: str, type: str | None = None) -> bytes: ...


# An unknown protocol answers as OpenAI does.
ERROR_RENDERERS: dict[str, ErrorRenderer] = {
    **{name: p.render_error for name, p in PROTOCOLS.items()},
    "kserve": kserve.render_error,
    "kserve-grpc": kserve_grpc.render_error,
    "mcp": mcp.render_error,
}


def render_error_body(protocol: str, status: int, message: str, type_: str | None = None) -> bytes:
    return ERROR_RENDERERS.get(protocol, ERROR_RENDERERS["openai"])(status, message, type_)
