"""One ext_proc stream = one `Session`: ProcessingRequest in, ProcessingResponse out.

The session decides without I/O of its own; where a decision needs I/O (a Redis bucket, a batch
wait) it awaits a small interface the `Gateway` hands it, so tests drive it with plain messages
and in-memory backends. The route table says which flow (chat, vision, ...) takes a request; a
flow has four steps: request body, response headers, response body, response trailers.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from urllib.parse import parse_qsl

import orjson

from contracts.envoy_names import CLUSTER_HEADER, TASK_ID_HEADER, TENANT_HEADER, parse_xlate_metadata
from contracts.errors import ClientError, ModelyardError, NotFound, Unavailable, UpstreamError, default_type
from extproc import messages as msg
from extproc.admission.auth import EXPIRED, Identity, any_client_key, caller_protocol, client_key, key_digest
from extproc.audit_trail import CallTrail
from extproc.batches.ids import is_batch_line
from extproc.context import Flow, Interim, RequestContext
from extproc.errors import error_response, render_error_body
from extproc.gateway import Gateway
from extproc.mcp.oauth import looks_like_jwt
from extproc.public_headers import scrub
from extproc.routes import Route, RouteTable
from extproc.tasks import state as task_state
from extproc.tasks.marker import MARKER_HEADER
from extproc.telemetry.audit import KEY_ADMIN, AuditEvent
from extproc.telemetry.audit_chain import key_id
from extproc.telemetry.metrics import AUDIT_REFUSED, ERRORS, STREAMS

log = logging.getLogger("modelyard.session")

# Headers only the gateway may set: a client sending them must not steer routing (nor pose as a replay).
RESERVED_HEADERS = (CLUSTER_HEADER, TENANT_HEADER, MARKER_HEADER, task_state.CALLBACK_HEADER)


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
        # Translation hops are part of a call the outer stream already records.
        self.trail = CallTrail(gateway.audit) if gateway.audit is not None and xlate is None else None
        self.callback_url: str | None = None  # a deferred request's webhook
        self._seen_headers: Iterable[str] | None = None  # the response headers' names, once read
        self._upstream_status = 0  # the response headers' :status, once read (the audit row's)
        STREAMS.inc()

    async def handle(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse | Interim | None:
        """The reply to `req`; an `Interim` when the step waits on purpose (the server sends its
        message, then awaits the rest)."""
        kind = req.WhichOneof("request")
        return self._outgoing(req, kind, await self._handle(req, kind))

    async def _resume(self, req: msg.ProcessingRequest, then: Callable[[], Awaitable[msg.ProcessingResponse | Interim]]
                      ) -> msg.ProcessingResponse | Interim:
        try:
            resp = await then()
            if isinstance(resp, msg.ProcessingResponse) and resp.WhichOneof("response") == "request_body":
                self.dispatched = True  # answered later, but sent upstream (an MCP stream): the response is the flow's
        except ModelyardError as e:
            resp = self.error(e)
        except Exception:  # as in _handle: our bug, answered 502 with the traceback in our log
            log.exception("task %s: unexpected error resuming a step", self.ctx.task_id if self.ctx else "-")
            resp = self.error(ModelyardError("the gateway could not process this request", status=502))
        out = self._outgoing(req, req.WhichOneof("request"), resp)
        assert out is not None
        return out

    def _outgoing(self, req: msg.ProcessingRequest, kind: str | None,
                  resp: msg.ProcessingResponse | Interim | None) -> msg.ProcessingResponse | Interim | None:
        if resp is None:
            return None
        if isinstance(resp, Interim):
            return Interim(resp.message, functools.partial(self._resume, req, resp.then))
        immediate = resp.HasField("immediate_response")
        if (kind == "request_headers" or kind == "request_body") and not immediate:
            # A request-side reply carries no status and no response header: nothing to see or scrub.
            if self.trail is not None and self.trail.capture:
                self.trail.saw(req, resp)
            return resp
        if self.trail is not None:
            # The response headers' :status as the step read it (the audit row's), not scanned again.
            hint = self._upstream_status if kind == "response_headers" and self._upstream_status and not immediate \
                else None
            self.trail.saw(req, resp, hint)
        seen: Iterable[str] = ()
        if kind == "response_headers":
            seen = self._seen_headers if self._seen_headers is not None else [
                h.key for h in req.response_headers.headers.headers]
            self._seen_headers = None
        elif kind == "response_trailers":
            seen = [h.key for h in req.response_trailers.trailers.headers]
        return scrub(resp, seen)

    async def _handle(self, req: msg.ProcessingRequest, kind: str | None) -> msg.ProcessingResponse | Interim | None:
        try:
            if kind == "request_headers":
                return await self._request_headers(req)
            if self.flow is None or self.ctx is None:
                return _passthrough(kind)
            if kind == "request_body":
                resp = await self.flow.request_body(req.request_body.body)
                if isinstance(resp, Interim):  # answered later by the gateway itself (an MCP call): nothing goes upstream
                    return resp
                self.dispatched = resp.WhichOneof("response") == "request_body"
                if self.dispatched and self.ctx.deferred:
                    return await self._defer(req.request_body.body)
                return resp
            if not self.dispatched and kind in ("response_headers", "response_body"):
                return self._local_reply(req)
            if kind == "response_headers":
                headers = msg.header_map(req.response_headers)
                self._seen_headers = headers.keys()  # scrub reads the names; no second scan
                status = self._upstream_status = int(headers.get(":status", "200") or 200)
                out = self.flow.response_headers(status, headers)
                return out if isinstance(out, msg.ProcessingResponse) else await out
            if kind == "response_body":
                out = self.flow.response_body(req.response_body.body, req.response_body.end_of_stream)
                return out if isinstance(out, msg.ProcessingResponse) else await out
            if kind == "response_trailers":
                return self.flow.response_trailers(msg.header_map(req.response_trailers))
            return _passthrough(kind)
        except ModelyardError as e:
            return self.error(e)
        except Exception:  # a bug of ours must not become a 500 without a trace, nor kill the stream
            log.exception("task %s: unexpected error in %s", self.ctx.task_id if self.ctx else "-", kind)
            if kind in ("request_headers", "request_body"):
                # 502, not 500: callers and SDKs retry a bad gateway; the traceback is in our log.
                return self.error(ModelyardError("the gateway could not process this request", status=502))
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

    def error(self, e: ModelyardError) -> msg.ProcessingResponse:
        protocol = self.ctx.protocol if self.ctx else "openai"
        if self.ctx is not None and self.ctx.trace is not None:
            self.ctx.trace.failed(e)
        ERRORS.labels(protocol, str(e.status)).inc()
        extra = self.ctx.task_headers() if self.ctx else []
        return error_response(protocol, e, extra)

    async def _request_headers(self, req: msg.ProcessingRequest) -> msg.ProcessingResponse | Interim:
        h = req.request_headers
        headers = msg.header_map(h)
        raw_path = headers.get(":path", "/")
        path, _, qs = raw_path.partition("?")
        self.ctx = ctx = RequestContext(
            task_id=_task_id(),
            method=headers.get(":method", "GET"),
            path=path,
            query=dict(parse_qsl(qs)) if qs else {},
            headers=headers,
        )
        route = self.routes.match(ctx.method, path)
        ctx.protocol = route.protocol
        ctx.path_model, ctx.path_version, ctx.stream_hint = route.path_model, route.path_version, route.stream
        if self.gw.tracing is not None and (route.flow is not None or self.xlate is not None):
            ctx.trace = self.gw.tracing.start_request(headers, protocol=route.protocol, operation=route.operation,
                                                      hop=self.xlate)
        if self.xlate is not None:
            return self._translation_hop(ctx, route, self.xlate)
        if route.admin:
            return await self._admin(req, route, ctx)
        if route.console:
            return await self._console(req, route, ctx)
        if route.public and route.answer is not None:
            return await _answer(route, self.gw, ctx)
        key: str | None = None  # a replay has none: its marker says whose it is
        found: object = None
        digest: str | None = None
        replay = self.gw.tasks.replay_of(headers) if self.gw.tasks is not None else None
        if replay is not None:  # the task worker's replay: its marker, not a stored key, says whose it is
            ctx.task_id, tenant = replay
            ctx.replayed = True
            ctx.batch_line = is_batch_line(ctx.task_id)
            named = self.gw.keyring.identity_named(tenant)
            if named is not None:
                ctx.tenant, ctx.caller = named.tenant, named.caller
        else:
            if route.any_key:  # task polls, /v1/models: the caller may speak any protocol
                key = any_client_key(ctx.headers, ctx.query)
                ctx.protocol = caller_protocol(ctx.headers, ctx.query) or ctx.protocol  # its answer, its errors' shape
            else:
                key = client_key(ctx.protocol, ctx.headers, ctx.query)
            digest = key_digest(key) if key else None  # once: the key lookup's and the audit row's
            mcp = self.gw.mcp if ctx.protocol == "mcp" else None
            if key and mcp is not None and mcp.oauth is not None and looks_like_jwt(key):
                found, digest = await mcp.bearer_identity(key, self.gw.keyring)  # OAuth bearer (docs/mcp.md)
            else:
                found = await self.gw.keyring.identify_at_once(digest)
            if isinstance(found, Identity):
                ctx.tenant, ctx.caller = found.tenant, found.caller
                ctx.key_digest = digest or ""
        if self.trail is not None:
            ctx.client = msg.client_address(req, headers)
            self.trail.authenticated(ctx, key, digest)
            if self.trail.log.backlogged:
                # Fail closed: a call the audit log cannot keep up with is not served (nor queued:
                # the backlog must shrink); the metric counts them.
                AUDIT_REFUSED.inc()
                self.trail = None
                raise Unavailable("the gateway is behind on its audit log; retry shortly", retry_after_s=1)
        if ctx.tenant is None:
            # /mcp with OAuth on: the challenge says where the resource metadata is (RFC 9728).
            challenge = self.gw.mcp.challenge() if ctx.protocol == "mcp" and self.gw.mcp is not None else []
            raise ClientError("API key expired" if found is EXPIRED else "invalid or missing API key", status=401,
                              headers=challenge)
        if route.answer is not None:
            return await _answer(route, self.gw, ctx)
        if h.end_of_stream:
            raise ClientError("request body is required")
        encoding = headers.get("content-encoding")
        if encoding and encoding.strip().lower() != "identity":
            # Envoy inflates gzip, br and zstd before we see the body; anything left we cannot read.
            raise ClientError(f"Content-Encoding {encoding[:32]!r} is not supported: send the body uncompressed "
                              "or as gzip, br or zstd", status=415)
        assert route.flow is not None
        # A gRPC caller has no 202 + poll: its call is answered in place.
        if (self.gw.tasks is not None and replay is None and ctx.protocol != "kserve-grpc"
                and task_state.prefers_async(headers.get("prefer"))):
            ctx.deferred = True
            self.callback_url = self.gw.tasks.check_callback(ctx.tenant.name, headers)
        self.flow = route.flow(self.gw, ctx)
        # Strip reserved headers now: the body step sets the real ones.
        return _STRIP_RESERVED

    async def _admin(self, req: msg.ProcessingRequest, route: Route, ctx: RequestContext
                     ) -> msg.ProcessingResponse | Interim:
        """The admin API (`keys.admin_keys`): its own key, its own audit rows (not a tenant's call)."""
        self.trail = None
        if not self.gw.admin_keys.enabled or self.gw.key_admin is None:  # off: as any unknown URL
            raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
        key = any_client_key(ctx.headers, ctx.query)
        digest = self.gw.admin_keys.check(key)
        if digest is None:
            if self.gw.audit is not None:
                ctx.client = msg.client_address(req, ctx.headers)
                who = key_id(key) if key else ""
                self.gw.audit.record(AuditEvent(
                    event=KEY_ADMIN, time=time.time(), task_id=ctx.task_id, key_id=who, client=ctx.client,
                    method=ctx.method, path=ctx.path, status=401,
                    detail={"op": "auth", "reason": "not an admin key" if key else "missing admin key"}))
            raise ClientError("invalid or missing admin key", status=401)
        ctx.admin = digest
        if self.gw.audit is not None:
            ctx.client = msg.client_address(req, ctx.headers)
        if route.answer is not None:
            return await _answer(route, self.gw, ctx)
        assert route.flow is not None
        self.flow = route.flow(self.gw, ctx)
        if req.request_headers.end_of_stream:  # no body coming: the flow answers (and audits) an empty one
            return await self.flow.request_body(b"")
        return _STRIP_RESERVED

    async def _console(self, req: msg.ProcessingRequest, route: Route, ctx: RequestContext
                       ) -> msg.ProcessingResponse | Interim:
        """The console (docs/console.md): off, it is any unknown URL; on, its shell checks the session
        cookie itself and audits its changes as the admin API's (not a tenant's call)."""
        self.trail = None
        if not self.gw.config.console.enabled or not self.gw.admin_keys.enabled or self.gw.key_admin is None:
            raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
        ctx.client = msg.client_address(req, ctx.headers)
        if route.answer is not None:
            return await _answer(route, self.gw, ctx)
        assert route.flow is not None
        self.flow = route.flow(self.gw, ctx)
        if req.request_headers.end_of_stream:
            return await self.flow.request_body(b"")
        return _STRIP_RESERVED

    async def _defer(self, body: bytes) -> msg.ProcessingResponse:
        """Validated, routed and admitted: store the request as a task and answer 202 (RFC 7240)."""
        ctx, board, flow = self.ctx, self.gw.tasks, self.flow
        assert ctx is not None and ctx.tenant is not None and board is not None and flow is not None
        flow.defer()
        self.dispatched = False
        query = ctx.headers.get(":path", "").partition("?")[2]
        stored = task_state.stored_request(ctx.method, ctx.path, query, ctx.headers, body)
        rec = await board.accept(ctx.task_id, ctx.tenant.name, ctx.protocol, stored, self.callback_url)
        return msg.immediate(202, orjson.dumps(task_state.accepted_view(rec)),
                             [("content-type", "application/json"), ("location", f"/v1/tasks/{rec.id}"),
                              ("preference-applied", "respond-async"), (TASK_ID_HEADER, rec.id)])

    def _translation_hop(self, ctx: RequestContext, route: Route, xlate: str) -> msg.ProcessingResponse:
        """Envoy failed over to a peer through an internal listener: the request is already
        authenticated, routed and admitted; it only needs rendering for the peer."""
        hop = parse_xlate_metadata(xlate)
        if hop is None or not route.translatable or route.protocol != hop[0]:
            raise UpstreamError(f"translation hop {xlate!r} got {ctx.method} {ctx.path}")
        self.flow = self.routes.hop(self.gw, ctx, hop[1])
        return msg.request_headers()

    def close(self) -> None:
        if not self.done:
            self.done = True
            STREAMS.dec()
            if self.flow is not None:
                self.flow.close()  # meters a call cut short, so the audit row below has its outcome
            if self.trail is not None and self.ctx is not None and self.trail.checked:
                self.trail.finish(self.ctx)
            if self.ctx is not None and self.ctx.trace is not None:
                self.ctx.trace.end()  # after the flow: its close may still meter the outcome


# The same reply for every routed request (nothing mutates a reply on the request side).
_STRIP_RESERVED = msg.request_headers(remove=RESERVED_HEADERS)

# Task ids: 32 hex digits (as uuid4().hex) cut from one os.urandom read per 256 requests: the same
# kernel randomness without a getrandom call per request (a syscall, and a GIL hand-off, each).
_ID_BYTES = 16
_POOL_IDS = 256
_id_pool: list[str] = []
os.register_at_fork(after_in_child=_id_pool.clear)  # a forked child must not reuse its parent's ids


def _task_id() -> str:
    if not _id_pool:
        raw = os.urandom(_ID_BYTES * _POOL_IDS).hex()
        _id_pool.extend(raw[i:i + 2 * _ID_BYTES] for i in range(0, len(raw), 2 * _ID_BYTES))
    return _id_pool.pop()


async def _answer(route: Route, gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse | Interim:
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

