"""One ext_proc stream = one `Session`: ProcessingRequest in, ProcessingResponse out.

The session decides without I/O of its own; where a decision needs I/O (a Redis bucket, a batch
wait) it awaits a small interface the `Gateway` hands it, so tests drive it with plain messages
and in-memory backends. The route table says which flow (chat, vision, ...) takes a request; a
flow has four steps: request body, response headers, response body, response trailers.
"""

from __future__ import annotations

import inspect
import logging
import uuid
from urllib.parse import parse_qsl

from extproc import messages as msg
from extproc.auth import client_key
from extproc.context import Flow, RequestContext
from extproc.errors import error_response, render_error_body
from extproc.gateway import Gateway
from extproc.headers import CLUSTER_HEADER, TENANT_HEADER
from extproc.public_headers import scrub
from extproc.routes import Route, RouteTable
from extproc.telemetry.metrics import ERRORS, STREAMS
from modelyard.errors import ClientError, ModelyardError, UpstreamError, default_type

log = logging.getLogger("modelyard.session")

# Headers only the gateway may set: a client sending them must not steer routing.
RESERVED_HEADERS = (CLUSTER_HEADER, TENANT_HEADER)


class Session:
    def __init__(self, gateway: Gateway, routes: RouteTable, xlate: str | None = None):
        self.gw = gateway
        self.routes = routes
        self.xlate = xlate  # "<protocol>~<cluster>" on a translation hop's streams
        self.ctx: RequestContext | None = None
        self.flow: Flow | None = None
        self.dispatched = False  # the request went upstream: response messages belong to the flow
        self.local_status = 0
        self.done = False
        STREAMS.inc()

    async def handle(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse | None:
        resp = await self._handle(req)
        if resp is None:
            return None
        kind = req.WhichOneof("request")
        seen: list[str] = []
        if kind == "response_headers":
            seen = [h.key for h in req.response_headers.headers.headers]
        elif kind == "response_trailers":
            seen = [h.key for h in req.response_trailers.trailers.headers]
        return scrub(resp, seen)

    async def _handle(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse | None:
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
        except ModelyardError as e:
            return self._error(e)
        except Exception:  # a bug of ours must not become a 500 without a trace, nor kill the stream
            log.exception("task %s: unexpected error in %s", self.ctx.task_id if self.ctx else "-", kind)
            if kind in ("request_headers", "request_body"):
                # 502, not 500: callers and SDKs retry a bad gateway; the traceback is in our log.
                return self._error(ModelyardError("the gateway could not process this request", status=502))
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
        ERRORS.labels(self.ctx.protocol, str(status)).inc()
        body = render_error_body(self.ctx.protocol, status, text, default_type(status))
        return msg.response_body([("content-length", str(len(body)))], body=body)

    def _error(self, e: ModelyardError) -> msg.ProcessingResponse:
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
        )
        route = self.routes.match(ctx.method, path)
        ctx.protocol = route.protocol
        ctx.path_model, ctx.path_version, ctx.stream_hint = route.path_model, route.path_version, route.stream
        if self.xlate is not None:
            return self._translation_hop(ctx, route, self.xlate)
        if route.public and route.answer is not None:
            return await _answer(route, self.gw, ctx)
        ctx.tenant = self.gw.keyring.tenant_for(client_key(ctx.protocol, ctx.headers, ctx.query))
        if ctx.tenant is None:
            raise ClientError("invalid or missing API key", status=401)
        if route.answer is not None:
            return await _answer(route, self.gw, ctx)
        if h.end_of_stream:
            raise ClientError("request body is required")
        assert route.flow is not None
        self.flow = route.flow(self.gw, ctx)
        # Strip reserved headers now: the body step sets the real ones.
        return msg.request_headers(remove=RESERVED_HEADERS)

    def _translation_hop(self, ctx: RequestContext, route: Route, xlate: str) -> msg.ProcessingResponse:
        """Envoy failed over to a peer through an internal listener: the request is already
        authenticated, routed and admitted; it only needs rendering for the peer."""
        from_protocol, _, target = xlate.partition("~")
        if not route.translatable or route.protocol != from_protocol:
            raise UpstreamError(f"translation hop {xlate!r} got {ctx.method} {ctx.path}")
        self.flow = self.routes.hop(self.gw, ctx, target)
        return msg.request_headers()

    def close(self) -> None:
        if not self.done:
            self.done = True
            STREAMS.dec()
            if self.flow is not None:
                self.flow.close()


async def _answer(route: Route, gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    assert route.answer is not None
    resp = route.answer(gw, ctx)
    return await resp if inspect.isawaitable(resp) else resp


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

