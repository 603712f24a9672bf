"""One ext_proc stream = one `Session`: ProcessingRequest in, ProcessingResponse out.

The session decides without I/O of its own; where a decision needs I/O (a Redis bucket, a batch
wait) it awaits a small interface the `Gateway` hands it, so tests drive it with plain messages
and in-memory backends. Each request kind is a flow (chat, vision, ...) with four steps:
request body, response headers, response body, response trailers.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol
from urllib.parse import parse_qsl

import orjson

from extproc import messages as msg
from extproc.config import TenantConfig
from extproc.errors import GatewayError, error_response, render_error_body
from extproc.headers import CLUSTER_HEADER, TASK_ID_HEADER, TENANT_HEADER
from extproc.telemetry.metrics import ERRORS, STREAMS

if TYPE_CHECKING:
    from extproc.gateway import Gateway

log = logging.getLogger("modelyard.session")

# Headers only the gateway may set: a client sending them must not steer routing.
RESERVED_HEADERS = (CLUSTER_HEADER, TENANT_HEADER)


@dataclass
class RequestContext:
    """What the request headers told us; shared by every flow."""

    task_id: str
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    protocol: str  # the client's protocol: its errors come back in this shape
    started: float = field(default_factory=time.monotonic)
    tenant: TenantConfig | None = None
    path_model: str | None = None
    stream_hint: bool = False
    response_headers: list[tuple[str, str]] = field(default_factory=list)

    def task_headers(self) -> list[tuple[str, str]]:
        return [(TASK_ID_HEADER, self.task_id), *self.response_headers]


class Flow(Protocol):
    """The per-kind half of a session: everything after authentication."""

    async def request_body(self, body: bytes) -> msg.ProcessingResponse: ...
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse: ...
    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse: ...
    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse: ...
    def close(self) -> None: ...


class Session:
    def __init__(self, gateway: "Gateway", xlate: str | None = None):
        self.gw = gateway
        self.xlate = xlate  # "<protocol>~<cluster>" on a translation hop's streams
        self.ctx: RequestContext | None = None
        self.flow: Flow | None = None
        self.dispatched = False  # the request went upstream: response messages belong to the flow
        self.local_status = 0
        self.done = False
        STREAMS.inc()

    async def handle(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse | None:
        kind = req.WhichOneof("request")
        try:
            if kind == "request_headers":
                return await self._request_headers(req.request_headers)
            if self.flow is None or self.ctx is None:
                return _passthrough(kind)
            if kind == "request_body":
                resp = await self.flow.request_body(req.request_body.body)
                self.dispatched = resp.WhichOneof("response") == "request_body"
                return resp
            if not self.dispatched and kind in ("response_headers", "response_body"):
                return self._local_reply(req)
            if kind == "response_headers":
                headers = msg.header_map(req.response_headers)
                return self.flow.response_headers(int(headers.get(":status", "200") or 200), headers)
            if kind == "response_body":
                return self.flow.response_body(req.response_body.body, req.response_body.end_of_stream)
            if kind == "response_trailers":
                return self.flow.response_trailers(msg.header_map(req.response_trailers))
            return _passthrough(kind)
        except GatewayError as e:
            return self._error(e)
        except Exception:  # a bug of ours must not become a 500 without a trace, nor kill the stream
            log.exception("task %s: unexpected error in %s", self.ctx.task_id if self.ctx else "-", kind)
            if kind in ("request_headers", "request_body"):
                return self._error(GatewayError(502, "the gateway could not process this request", "api_error"))
            return _passthrough(kind)

    def _local_reply(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse:
        """Envoy answered by itself before the request went upstream (a body over the buffer
        limit: 413): say it in the caller's protocol like any error of ours."""
        assert self.ctx is not None
        if req.WhichOneof("request") == "response_headers":
            self.local_status = int(msg.header_map(req.response_headers).get(":status", "500") or 500)
            return msg.response_headers([("content-type", "application/json"), *self.ctx.task_headers()],
                                        ["content-length"])
        status = self.local_status or 500
        text = req.response_body.body.decode("utf-8", "replace").strip()[:200] or "request refused"
        if status == 413:
            text = f"request body is larger than the gateway accepts ({text})"
        type_ = "invalid_request_error" if status < 500 else "api_error"
        ERRORS.labels(self.ctx.protocol, str(status)).inc()
        body = render_error_body(self.ctx.protocol, status, text, type_)
        return msg.response_body([("content-length", str(len(body)))], body=body)

    def _error(self, e: GatewayError) -> msg.ProcessingResponse:
        protocol = self.ctx.protocol if self.ctx else "openai"
        ERRORS.labels(protocol, str(e.status)).inc()
        extra = self.ctx.task_headers() if self.ctx else []
        return error_response(protocol, e, extra)

    async def _request_headers(self, h: msg.pb.HttpHeaders) -> msg.ProcessingResponse:
        headers = msg.header_map(h)
        raw_path = headers.get(":path", "/")
        path, _, qs = raw_path.partition("?")
        self.ctx = ctx = RequestContext(
            task_id=uuid.uuid4().hex,
            method=headers.get(":method", "GET"),
            path=path,
            query=dict(parse_qsl(qs)),
            headers=headers,
            protocol="openai",
        )
        if self.xlate is not None:
            return self._translation_hop(ctx, self.xlate)
        route = self.gw.classify(ctx)
        ctx.protocol = route.protocol
        ctx.path_model = route.path_model
        ctx.stream_hint = route.stream
        if route.public:
            return route.answer(self.gw, ctx)  # type: ignore[misc]
        ctx.tenant = self.gw.keyring.tenant_for(self.gw.client_key(ctx))
        if ctx.tenant is None:
            raise GatewayError(401, "invalid or missing API key", "authentication_error")
        if route.answer is not None:
            return route.answer(self.gw, ctx)
        if h.end_of_stream:
            raise GatewayError(400, "request body is required", "invalid_request_error")
        self.flow = route.make_flow(self.gw, ctx)  # type: ignore[misc]
        # Strip reserved headers now: the body step sets the real ones.
        return msg.request_headers(remove=RESERVED_HEADERS)

    def _translation_hop(self, ctx: RequestContext, xlate: str) -> msg.ProcessingResponse:
        """Envoy failed over to a peer through an internal listener: the request is already
        authenticated, routed and admitted; it only needs rendering for the peer."""
        from adapters.registry import detect_client_protocol
        from extproc.flows.chat import XlateFlow

        from_protocol, _, target = xlate.partition("~")
        route = detect_client_protocol(ctx.method, ctx.path)
        if route is None or route.protocol != from_protocol:
            raise GatewayError(502, f"translation hop {xlate!r} got {ctx.method} {ctx.path}", "api_error")
        ctx.protocol, ctx.path_model, ctx.stream_hint = route.protocol, route.model, route.stream
        self.flow = XlateFlow(self.gw, ctx, target)
        return msg.request_headers()

    def close(self) -> None:
        if not self.done:
            self.done = True
            STREAMS.dec()
            if self.flow is not None:
                self.flow.close()


def _passthrough(kind: str | None) -> msg.ProcessingResponse:
    """Continue unchanged: the reply type must match the message Envoy sent."""
    if kind == "request_body":
        return msg.request_body()
    if kind == "response_headers":
        return msg.response_headers()
    if kind == "response_body":
        return msg.response_body()
    if kind == "response_trailers":
        return msg.response_trailers()
    if kind == "request_trailers":
        return msg.ProcessingResponse(request_trailers=msg.pb.TrailersResponse())
    return msg.request_headers()


def json_response(status: int, payload: object, ctx: RequestContext) -> msg.ProcessingResponse:
    return msg.immediate(status, orjson.dumps(payload),
                         [("content-type", "application/json"), *ctx.task_headers()])
