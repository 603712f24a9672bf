"""KServe v2 gRPC ingress: `inference.GRPCInferenceService` on the gateway's listener (HTTP/2).

`ModelInfer` is a flow like the REST infer: routed, admitted and metered the same way, sent to a
gRPC upstream as a message with the model name swapped both ways. To a REST upstream it goes as
one gRPC message holding the v2 REST body, through the deployment's bridge listener
(controlplane: Envoy's grpc_http1_reverse_bridge unframes it and gives the REST reply a frame
and grpc-status trailers, which an HTTP/1.1 reply lacks), and comes back as a ModelInferResponse.

Batching (docs/batching.md): a gRPC caller joins cross-caller batches like a REST one. A member
cannot be answered with an immediate response (Envoy turns a local reply to a gRPC caller into
trailers-only, no message), so its request goes on to the extproc's own gRPC port (`SLICE_PATH`)
carrying its slice of the leader's reply as the body: that stateless echo returns it as a real gRPC
reply, message and grpc-status trailers, which any extproc replica can give.

The other five calls carry a reply message, which an ext_proc immediate response cannot (Envoy
turns a local reply to a gRPC caller into trailers-only). The session routes them to the
extproc's own gRPC port instead (`EXTPROC_CLUSTER`), where `KServeAnswers` answers from the
same upstream probe as the REST endpoints. It authenticates the caller's key itself: any
replica may take the call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import grpc
import orjson
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from adapters import kserve, kserve_binary, kserve_grpc, kserve_meta
from adapters.kserve import slice_response
from adapters.upstream_errors import client_text, sanitize
from contracts.envoy_names import CLUSTER_HEADER, EXTPROC_CLUSTER, grpc_bridge_cluster
from contracts.errors import ClientError, ModelyardError, UpstreamError
from contracts.grpc_services import ServiceTable
from extproc import messages as msg
from extproc.admission.auth import Identity, client_key, key_digest
from extproc.context import RequestContext
from extproc.flows import local
from extproc.flows.upstream import upstream_error_status
from extproc.flows.vision import Job, KServeInferFlow
from extproc.gateway import Gateway, LiveGateway
from extproc.vision.batching import Batch, BatchPolicy

log = logging.getLogger("modelyard.kserve_grpc")

_GRPC_TRAILERS = ["grpc-status", "grpc-message", "grpc-status-details-bin"]


# The extproc's own echo: a batch member's slice goes up as the request and comes back as the reply.
SLICE_SERVICE = "modelyard.BatchSlice"
SLICE_PATH = f"/{SLICE_SERVICE}/Reply"


# Envoy's reverse bridge answers a REST error as grpc-status httpToGrpcStatus(HTTP status): the way back.
_BRIDGED_HTTP = {13: 400, 16: 401, 7: 403, 12: 404, 14: 503}


def _rest_refusal(body: bytes) -> str | None:
    """A KServe REST error body (`{"error": "..."}`, no outputs): its text; None for anything else."""
    if not body.startswith(b"{") or b'"error"' not in body:
        return None
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict) or "outputs" in doc or not isinstance(doc.get("error"), str):
        return None
    return str(doc["error"])


class GrpcInferFlow(KServeInferFlow):
    """`ModelInfer` from a gRPC caller (tritonclient.grpc) to a KServe gRPC or REST upstream."""

    def __init__(self, gw: Gateway, ctx: RequestContext):
        super().__init__(gw, ctx)
        self.grpc_error: tuple[int, str] | None = None  # ours, said in the trailers
        self.rest = False  # a REST deployment, reached through its bridge listener
        self.bridge_refusal: tuple[bytes, str] | None = None  # a REST error body the bridge framed

    def _policy(self) -> BatchPolicy | None:
        """Batched to a gRPC deployment, and a text model's to a REST one (the extproc makes that
        merged call itself; a caller that goes alone takes the bridge hop, which carries a REST body)."""
        choice = self.call.choice
        if choice is None or choice.deployment.protocol not in ("kserve-grpc", "kserve-rest"):
            return None
        if choice.deployment.protocol == "kserve-rest" and (self.model is None or self.model.vision is not None):
            return None
        return super()._policy()

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx = self.ctx
        req = kserve_grpc.parse_infer(body)
        name, version = req.model_name, req.model_version
        ctx.path_model, ctx.path_version = name, version or None
        self.model = self.gw.catalog.model_for(ctx.tenant, name)
        self.client_model = name
        choice = await self._route(name)
        dep = choice.deployment
        self.request_id = req.id
        if dep.protocol == "kserve-rest":
            self.rest = True
            self.request = req
            # A text model's tensors batch to a REST deployment too (the extproc makes the merged call).
            job = self._batch_job(req) if self.model.vision is None else None
            return await self._dispatch(job) if job is not None else await self._go_alone()
        if not self.grpc:
            raise UpstreamError(f"deployment {dep.cluster} speaks {dep.protocol}, not KServe")
        req.model_name = self.upstream_model
        self.request = req
        job = self._batch_job(req)
        if job is None:
            await self._own_slot()  # not batchable (its shape, datatype, parameters or outputs): alone
            return self._send(kserve.encode_infer_request(req))
        return await self._dispatch(job)

    async def _send_alone(self) -> msg.ProcessingResponse:
        if not self.rest:
            return await super()._send_alone()
        # One gRPC message holding the REST body, to the deployment's bridge listener: Envoy's
        # reverse bridge there unframes it and turns the REST reply into a gRPC one.
        assert self.call.choice is not None  # routed before anything goes upstream
        dep = self.call.choice.deployment
        binary = await self.gw.kserve_probe.takes_binary(dep)
        rest, length = await asyncio.to_thread(kserve.infer_request_rest, self.request, binary=binary,
                                               binary_outputs=False)
        extra = [] if length is None else [(kserve_binary.HEADER, str(length))]
        return self._send(kserve.frame(rest), kserve.rest_infer_path(self.upstream_model, self.ctx.path_version),
                          strip=["grpc-timeout"], extra=extra, cluster=grpc_bridge_cluster(dep.cluster))

    def _batch_job(self, req: Any) -> Job | None:
        job = super()._batch_job(req)
        if job is not None and job.text is not None:
            # Its reply must be a message with trailers: a refused batch's leader answering in the
            # response-headers step cannot give one, so a REST member leads where there is one; a
            # batch of gRPC callers only has its merged call made by the extproc (`_lead_directly`).
            job.answers_alone = False
        return job

    def _answer_member(self, batch: Batch, response: Any, start: int) -> msg.ProcessingResponse | None:
        """This member's slice, sent through Envoy to the extproc's echo, so that it comes back
        as a gRPC reply with trailers (None: fall back to its own call)."""
        assert self.job is not None
        try:
            part = slice_response(response, start, self.job.rows, total=batch.rows, request_id=self.request_id)
        except (ModelyardError, ValueError) as e:
            log.warning("task %s: batched reply unusable for this member (%s); own call", self.ctx.task_id, e)
            return None
        part.model_name = self.client_model
        self.role = "member"
        return self._send(kserve_grpc.render(part), SLICE_PATH, cluster=EXTPROC_CLUSTER)

    # -- response ----------------------------------------------------------------------------
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        self.upstream_status = status
        set_h = self.ctx.task_headers()
        gs = kserve.grpc_status_from_headers(headers)
        if gs is not None:  # trailers-only: the upstream's status is the caller's, its message sanitized
            self._fail_batch(f"upstream answered gRPC status {gs.code}")
            log.info("task %s: upstream answered gRPC status %d: %r", self.ctx.task_id, gs.code, gs.message[:2000])
            self._finish(gs.http_status)
            text = sanitize(gs.message) or f"upstream gRPC status {gs.code}"
            return msg.response_headers([*set_h, ("grpc-message", kserve.encode_grpc_message(text))], ["content-length"])
        if status != 200:  # a REST upstream's refusal (through the bridge): a status in the trailers
            self._fail_batch(f"upstream answered HTTP {status}")
            self.grpc_error = (kserve_grpc.grpc_code(upstream_error_status(status)), f"upstream answered HTTP {status}")
            set_h.append((":status", "200"))
        return msg.response_headers(set_h, ["content-length"])

    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse:
        if self.grpc_error is not None:
            if self.rest and self.upstream_status != 200:
                log.info("task %s: upstream answered HTTP %d", self.ctx.task_id, self.upstream_status)
                body = kserve.unframe(chunk) if chunk[:1] == b"\x00" and len(chunk) >= 5 else chunk
                self.grpc_error = (self.grpc_error[0], client_text(self.upstream_status, body, self.ctx.task_id))
            return msg.response_body(body=b"")
        if self.role == "member":  # the echo of our own slice, already under the gateway's name
            return msg.response_body()
        try:
            if self.rest:  # framed by the bridge: the REST reply, JSON
                body = kserve.unframe(chunk)
                refusal = _rest_refusal(body)
                if refusal is not None:  # a REST error the bridge framed; its status comes in the trailers
                    self._fail_batch("upstream refused the call")
                    self.bridge_refusal = (body, refusal)
                    return msg.response_body(body=b"")
                resp = kserve.parse_rest_reply(body, None)
            else:
                resp = kserve.parse_grpc_response(chunk)
            resp = self._leader_share(resp)
        except (ModelyardError, ValueError) as e:
            self._fail_batch(str(e))
            text = getattr(e, "message", str(e))
            self.grpc_error = (kserve_grpc.grpc_code(502), f"upstream sent an unusable reply: {text}")
            return msg.response_body(body=b"")
        resp.model_name = self.client_model  # the gateway's name, never the upstream's
        return msg.response_body(body=kserve_grpc.render(resp))

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        if self.bridge_refusal is not None:
            # The bridge said the REST status as a gRPC one (Envoy's HTTP-to-gRPC mapping): back to HTTP.
            gs = kserve.grpc_status_from_headers(trailers)
            upstream = _BRIDGED_HTTP.get(gs.code if gs is not None else -1, 502)
            status = upstream_error_status(upstream)
            log.info("task %s: REST upstream refused the call (HTTP %d): %s", self.ctx.task_id, upstream,
                     self.bridge_refusal[1][:2000])
            self.grpc_error = (kserve_grpc.grpc_code(status),
                               client_text(upstream, self.bridge_refusal[0], self.ctx.task_id))
        if self.grpc_error is not None:
            code, text = self.grpc_error
            self._finish(kserve.grpc_status_to_http(code))
            return msg.response_trailers([("grpc-status", str(code)), ("grpc-message", kserve.encode_grpc_message(text))],
                                         ["grpc-status-details-bin"])
        gs = kserve.grpc_status_from_headers(trailers)
        if gs is None or gs.code != 0:
            self._fail_batch("upstream ended without a reply")  # no-op once the reply completed it
        self._finish(gs.http_status if gs is not None else 502)
        if gs is None:
            return msg.response_trailers([("grpc-status", "13"), ("grpc-message", "upstream sent no status")])
        if gs.code != 0:  # the upstream's own status; its message sanitized as for REST callers
            text = sanitize(gs.message) or f"upstream gRPC status {gs.code}"
            return msg.response_trailers([("grpc-message", kserve.encode_grpc_message(text))])
        return msg.response_trailers()


def answer_on_extproc(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """Send the call to the extproc's own `KServeAnswers` (a reply message needs a real upstream)."""
    return msg.request_headers([(CLUSTER_HEADER, EXTPROC_CLUSTER)], clear_route_cache=True)


class KServeAnswers(pb_grpc.GRPCInferenceServiceServicer):
    """Health, readiness and metadata for gRPC callers, from the upstream probe (as for REST)."""

    def __init__(self, gw: Gateway | LiveGateway) -> None:
        self._live = gw if isinstance(gw, LiveGateway) else LiveGateway(gw)

    @property
    def gw(self) -> Gateway:
        """The running snapshot, read per call: a reload swaps it."""
        return self._live.current

    async def _ctx(self, context: grpc.aio.ServicerContext, method: str) -> RequestContext:
        headers = {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        ctx = RequestContext(task_id=uuid.uuid4().hex, method="POST",
                             path=kserve_grpc.PATH_PREFIX + method, query={}, headers=headers,
                             protocol="kserve-grpc")
        key = client_key(ctx.protocol, headers, {})
        found = await self.gw.keyring.identify_at_once(key_digest(key) if key else None)
        if not isinstance(found, Identity):
            raise ClientError("invalid or missing API key", status=401)
        ctx.tenant = found.tenant
        return ctx

    async def _run(self, context: grpc.aio.ServicerContext, work: Any) -> Any:
        try:
            return await work
        except ModelyardError as e:
            await context.abort(_status_code(e.status), e.message)

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:  # noqa: N802
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:  # noqa: N802
        return pb.ServerReadyResponse(ready=await local.server_ready(self.gw))

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:  # noqa: N802
        doc = kserve_meta.server_metadata(local.server_version())  # the same answer as GET /v2
        return pb.ServerMetadataResponse(**doc)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:  # noqa: N802
        async def work() -> pb.ModelReadyResponse:
            ctx = await self._ctx(context, "ModelReady")
            return pb.ModelReadyResponse(ready=await local.model_ready(self.gw, ctx, request.name,
                                                                       request.version or None))
        return await self._run(context, work())

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:  # noqa: N802
        async def work() -> pb.ModelMetadataResponse:
            ctx = await self._ctx(context, "ModelMetadata")
            doc = await local.model_metadata(self.gw, ctx, request.name, request.version or None)
            return kserve_meta.metadata_to_grpc(doc)
        return await self._run(context, work())


def _status_code(http_status: int) -> grpc.StatusCode:
    code = kserve_grpc.grpc_code(http_status)
    return next(s for s in grpc.StatusCode if s.value[0] == code)


async def _echo_slice(request: bytes, context: Any) -> bytes:
    """A batch member's slice, returned as sent: the extproc built it; Envoy frames the reply."""
    return request


def add_to_server(server: ServiceTable, gw: Gateway | LiveGateway) -> None:
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(KServeAnswers(gw), server)
    # Raw bytes both ways (no (de)serializer): the slice is never parsed again.
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        SLICE_SERVICE, {"Reply": grpc.unary_unary_rpc_method_handler(_echo_slice)})])
