"""What every flow shares: the request's context and the `Flow` protocol a session drives.

A leaf of the request path: the session, the route table and the flows all import it, and it
imports none of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal, Protocol

import orjson

from extproc import messages as msg
from extproc.config import TenantConfig
from extproc.headers import TASK_ID_HEADER

# The caller's protocol: its errors come back in this shape.
ClientProtocol = Literal["openai", "anthropic", "gemini", "kserve", "kserve-grpc"]


@dataclass
class RequestContext:
    """What the request headers told us; shared by every flow."""

    task_id: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    protocol: ClientProtocol = "openai"
    started: float = field(default_factory=time.monotonic)
    tenant: TenantConfig | None = None
    path_model: str | None = None
    path_version: str | None = None
    stream_hint: bool = False
    response_headers: list[tuple[str, str]] = field(default_factory=list)

    def task_headers(self) -> list[tuple[str, str]]:
        return [(TASK_ID_HEADER, self.task_id), *self.response_headers]

    @property
    def tenant_name(self) -> str:
        return self.tenant.name if self.tenant else "-"


class Flow(Protocol):
    """The per-kind half of a session: everything after authentication."""

    async def request_body(self, body: bytes) -> msg.ProcessingResponse: ...
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse: ...
    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse: ...
    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse: ...
    def close(self) -> None: ...


def json_response(status: int, payload: object, ctx: RequestContext) -> msg.ProcessingResponse:
    """An answer of the gateway's own (model lists, health), with the task headers."""
    return msg.immediate(status, orjson.dumps(payload), [("content-type", "application/json"), *ctx.task_headers()])
