"""Vision requests: KServe v2 REST infer and multipart image classification (docs/vision.md).

Both flows parse and validate in the client's shape, route and admit, then either send their own
`ModelInfer` call upstream through Envoy or join a batch (`extproc/vision/batching.py`, docs/batching.md):
the batch's leader carries the merged tensor upstream, the other members wait inside their
request-body step and answer with an immediate response cut from the leader's reply. A text batch
with no REST caller to lead it, or to a KServe REST deployment, has its merged call made by the
extproc itself (`_lead_directly`), and every caller answers with its slice.

gRPC replies: errors usually come trailers-only (grpc-status in the response headers, no body),
answered at once with an immediate response; a success has its message in the body and
grpc-status 0 in the trailers. The body is buffered, so the JSON is rendered from the whole reply.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal

import grpc
import numpy as np

from adapters import kserve, kserve_binary
from adapters.images import ImageBudget, ImageError, check_images, decode_checked
from adapters.kserve import slice_response
from adapters.multipart import MultipartLimits, parse_multipart, read_classify_form
from adapters.upstream_errors import client_text, log_excerpt, sanitize
from contracts.config import TensorInput
from contracts.envoy_names import UPSTREAM_HOST_HEADER
from contracts.errors import ClientError, ModelyardError, UpstreamError, default_type
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.context import RequestContext
from extproc.errors import render_error_body
from extproc.flows.embedding_batch import refused
from extproc.flows.upstream import UpstreamCall, upstream_error_status
from extproc.gateway import Gateway
from extproc.routing import RouteRequest
from extproc.vision.batching import Batch, Batcher, BatchKey, BatchPolicy, Member, merge_rows
from kernels import Backend, PreprocessSpec

log = logging.getLogger("modelyard.vision")

# A member waits for its batch's reply at most this long, then makes its own call: under Envoy's
# 10 s ext_proc message timeout, so a slow leader never turns into an ext_proc timeout.
MEMBER_WAIT_S = 8.0
_STRIP_RESPONSE = ["content-length", "grpc-status", "grpc-message", "grpc-encoding", "grpc-accept-encoding",
                   "grpc-status-details-bin"]
_JSON = ("content-type", "application/json")
ContentHeaders = list[tuple[str, str]]


def _content_headers(header_length: int | None) -> ContentHeaders:
    """JSON, or the binary tensor extension's body with its header length."""
    if header_length is None:
        return [_JSON]
    return [("content-type", kserve_binary.CONTENT_TYPE), (kserve_binary.HEADER, str(header_length))]


# single: its own call; leader: carries its batch upstream; member: answered from the leader's reply.
VisionRole = Literal["single", "leader", "member"]


@dataclass(slots=True)
class Job:
    """What one request adds to a merged call: decoded images (classify) or a ready tensor (v2)."""

    rows: int
    images: list[np.ndarray] | None = None
    tensor: np.ndarray | None = None
    text: kserve.TensorRows | None = None  # a model without `vision`: raw rows of any tensor (BYTES texts, token ids)
    # A REST caller: leading a text batch, its stream may carry the merged call (if that is refused, it
    # makes its own call). A batch with no such member has its merged call made by the extproc itself.
    answers_alone: bool = True


def _spec(ti: TensorInput) -> PreprocessSpec:
    return PreprocessSpec.from_tensor_input(ti)  # a few microseconds; a frozen value, equal per config




def merge_batch(batch: Batch, backend: Backend, spec: PreprocessSpec) -> np.ndarray:
    """The merged tensor in member order; every member's images go through ONE kernel call."""
    images = [im for m in batch.members if m.payload.images is not None for im in m.payload.images]
    pre = backend.preprocess(images, spec) if images else np.empty((0,))
    segments: list[np.ndarray] = []
    k = 0
    for m in batch.members:
        job: Job = m.payload
        if job.images is not None:
            segments.append(pre[k:k + len(job.images)])
            k += len(job.images)
        elif job.tensor is not None:
            segments.append(job.tensor)
    return merge_rows(segments)


class _VisionFlow:
    task_type = "infer"
    needs_vision = True  # routing asks for image support only when the request carries images

    def __init__(self, gw: Gateway, ctx: RequestContext):
        self.gw = gw
        self.ctx = ctx
        self.model: Any = None
        self.call = UpstreamCall(gw, ctx)
        self.upstream_model = ""
        self.grpc = True
        self.role: VisionRole = "single"
        self.member: Member | None = None
        self.batch: Batch | None = None
        self.job: Job | None = None
        self.request_id = ""
        self.error_status = 0  # an HTTP error status seen in the response headers
        self.client_model = ""  # the gateway's name for the model, the one replies carry
        self.rest_header_length: str | None = None  # a REST upstream's binary reply
        self.parsed: kserve.ParsedInfer | None = None  # a v2 infer: how the caller wants its outputs
        self.upstream_status = 0
        self.request: Any = None  # a v2 infer's ModelInferRequest (what a text batch's leader merges into)

    # -- hooks the two flows fill in ---------------------------------------------------------
    def _render_ok(self, resp: Any) -> tuple[bytes, ContentHeaders]:
        raise NotImplementedError

    async def _single_body(self) -> bytes:
        """This request's own gRPC-framed ModelInfer body (no batch)."""
        raise NotImplementedError

    async def _own_body(self) -> bytes:
        """This request alone, rendered for the upstream (the preprocessing, for an image form)."""
        with self.ctx.span("translate request"):
            return await self._single_body()

    async def _send_alone(self) -> msg.ProcessingResponse:
        """This request as its own upstream call through Envoy (no batch, or a batch that failed)."""
        return self._send(await self._own_body())

    async def _own_slot(self) -> None:
        """A batching model's request routed without a slot (it was to share a batch's call) that makes
        its own call after all: it waits for a slot first, like any other request."""
        if self.call.choice is not None:
            await self.gw.dispatcher.own_call_slot(self.ctx, self.call.choice)

    async def _go_alone(self) -> msg.ProcessingResponse:
        """This request's own call (not a batch's), holding a slot of the deployment's `max_inflight`."""
        await self._own_slot()
        return await self._send_alone()

    # -- routing and sending -----------------------------------------------------------------
    async def _route(self, name: str) -> Choice:
        ctx = self.ctx
        assert ctx.tenant is not None
        self.call.choice = choice = self.gw.dispatcher.choose_for(ctx, RouteRequest(
            model=name, tenant=ctx.tenant, task_type=self.task_type, needs_vision=self.needs_vision,
            task_id=ctx.task_id))
        await self.gw.dispatcher.admit(ctx, choice, 0)
        if self._policy() is None:
            # A request that goes alone takes a slot; batch members share one upstream call, so they do not queue.
            await self.gw.dispatcher.wait_for_slot(ctx, choice)
        ctx.response_headers += choice.response_headers()
        dep = choice.deployment
        self.upstream_model = dep.upstream_model or choice.model.name
        self.grpc = dep.protocol == "kserve-grpc"  # the transport: gRPC messages or REST bodies
        return choice

    def _send(self, body: bytes, path: str = kserve.GRPC_INFER_PATH,
              content_type: str = kserve.GRPC_CONTENT_TYPE, strip: list[str] | None = None,
              extra: list[tuple[str, str]] | None = None, cluster: str | None = None) -> msg.ProcessingResponse:
        strip = list(strip or [])
        if self.grpc:
            strip.append(kserve_binary.HEADER)  # the tensors now travel as raw contents
        # A REST call sets no deadline of its own (as it never did): the route's timeout bounds it.
        return self.call.request(path, body, {"content-type": content_type}, cluster=cluster,
                                 deadline="grpc" if self.grpc else None, extra=extra or (), strip=strip)

    def _policy(self) -> BatchPolicy | None:
        cfg = self.model.batching if self.model is not None else None
        if self.ctx.deferred:
            return None  # an acceptance for later joins no batch: its replay will
        choice = self.call.choice
        if cfg is None or not cfg.enabled or self.gw.batcher is None or not choice:
            return None
        return BatchPolicy.from_config(cfg, len(choice.deployment.endpoints))

    @property
    def _batcher(self) -> Batcher:
        assert self.gw.batcher is not None  # only reached once `_policy` said this model batches
        return self.gw.batcher

    async def _dispatch(self, job: Job) -> msg.ProcessingResponse:
        """Join a batch when the model batches, else (or on fallback) send this request alone."""
        self.job = job
        policy = self._policy()
        member = None
        if policy is not None and self.call.choice is not None:
            cluster = self.call.choice.deployment.cluster
            if job.text is not None:
                t = job.text
                # The version asked for is part of the call: requests for different versions never merge.
                key = BatchKey(self.model.name, cluster, t.row_shape, t.datatype,
                               (t.variant, self.ctx.path_version or ""))
            else:
                ti = self.model.vision.input
                # Tensors for another version go to another model on the server: they never merge.
                key = BatchKey(self.model.name, cluster, (3, ti.height, ti.width), ti.datatype,
                               self.ctx.path_version or None)
            # The window counts from the request's arrival: its own parsing and routing are part of the wait.
            member = self._batcher.join(key, policy, job, job.rows, arrived=self.ctx.started)
        if member is None:
            return await self._go_alone()
        self.member = member
        with self.ctx.span("batching") as span:
            outcome = await self._batcher.wait(member, MEMBER_WAIT_S)
            if span is not None:
                span.set_attributes({"modelyard.batch.role": outcome.role, "modelyard.batch.rows": job.rows})
        if outcome.role == "leader" and outcome.batch is not None:
            return await self._lead(outcome.batch)
        if outcome.role == "result" and outcome.batch is not None:
            answer = self._answer_member(outcome.batch, outcome.response, outcome.start)
            if answer is not None:
                return answer
        else:
            log.info("task %s: batch fallback (%s)", self.ctx.task_id, outcome.reason)
        self.role = "single"
        return await self._go_alone()

    async def _lead(self, batch: Batch) -> msg.ProcessingResponse:
        self.role, self.batch = "leader", batch
        if self.job is not None and self.job.text is not None:
            if len(batch.members) == 1:  # alone in its batch: as sent, no merge, no padding, no split
                return await self._send_alone()
            try:
                pad = self.model.batching.pad if self.model.batching is not None else None
                merged = kserve.merge_tensor_requests(self.request, [m.payload.text for m in batch.members],
                                                      self.ctx.task_id, pad)
            except BaseException:
                self._batcher.fail(batch, "the leader could not build the merged tensor")
                raise
            if not self.grpc or not self.job.answers_alone:
                return await self._lead_directly(batch, merged)
            return self._send(kserve.encode_infer_request(merged))
        v = self.model.vision
        try:
            with self.ctx.span("translate request"):  # the whole batch's tensor, built by its leader
                tensor = await asyncio.to_thread(merge_batch, batch, self._backend(), _spec(v.input))
                req = kserve.build_classify_request(self.upstream_model, tensor, v.input, output=v.output,
                                                    request_id=self.ctx.task_id, version=self.ctx.path_version or "")
        except BaseException:
            self._batcher.fail(batch, "the leader could not build the merged tensor")
            raise
        return self._send(kserve.encode_infer_request(req))

    async def _lead_directly(self, batch: Batch, merged: Any) -> msg.ProcessingResponse:
        """The merged call made by the extproc itself, straight at the deployment, so that no caller's
        stream spends its upstream call on it: a REST deployment's (its reply is JSON to cut), or a
        batch of gRPC callers only (whose leader could not answer a refusal in its own protocol).
        Every caller, this one too, is answered with its slice; if the call fails or is refused,
        every caller's request goes on through Envoy unchanged as its own call, so only a bad
        input's caller gets its error."""
        choice, member, job = self.call.choice, self.member, self.job
        assert choice is not None and member is not None and job is not None
        dep = choice.deployment
        endpoint = random.choice(dep.endpoints)  # the merged call's share of balancing over the endpoints
        # Within what the members wait (then they make their own calls), under Envoy's ext_proc message timeout.
        waited = self._batcher.clock() - member.joined
        timeout = min(dep.timeout_ms / 1000, max(0.5, MEMBER_WAIT_S - waited))
        try:
            with self.ctx.span("batched call"):
                if self.grpc:
                    resp = await self.gw.kserve_probe.infer(dep, endpoint, merged, timeout)
                else:
                    resp = await self.gw.kserve_probe.infer_rest(dep, endpoint, self.upstream_model,
                                                                 self.ctx.path_version, merged, timeout)
            # Every output must hold one row per batch row before anyone gets a slice of it.
            slice_response(resp, member.start, job.rows, total=batch.rows, request_id=self.request_id)
        except (grpc.aio.AioRpcError, ModelyardError, ValueError) as e:
            reason = f"the merged call failed ({e.code().name if isinstance(e, grpc.aio.AioRpcError) else e})"
            log.info("task %s: %s; every caller makes its own call", self.ctx.task_id, reason)
            self._batcher.fail(batch, reason)
            self.role, self.batch = "single", None
            return await self._go_alone()
        except BaseException:
            self._batcher.fail(batch, "the merged call did not finish")
            raise
        self._batcher.complete(batch, resp)
        answer = self._answer_member(batch, resp, member.start)
        if answer is not None:
            return answer
        self.role, self.batch = "single", None
        return await self._go_alone()

    def _leader_share(self, resp: Any) -> Any:
        """The leader's own rows of a merged reply, after handing the whole reply to the batch's
        other members; any other reply as it is. Raises (ModelyardError, ValueError) for a reply
        of the wrong shape before any member gets it: the caller fails the batch."""
        if self.role != "leader" or self.batch is None or self.member is None or not self.job:
            return resp
        if self.job.text is not None and len(self.batch.members) == 1:
            self._batcher.complete(self.batch, resp)  # it went as sent: the reply is its own
            return resp
        own = slice_response(resp, self.member.start, self.job.rows, total=self.batch.rows,
                             request_id=self.request_id)
        self._batcher.complete(self.batch, resp)
        return own

    def _answer_member(self, batch: Batch, response: Any, start: int) -> msg.ProcessingResponse | None:
        """This member's slice of the leader's reply as an immediate response (None: fall back)."""
        assert self.job is not None
        try:
            part = slice_response(response, start, self.job.rows, total=batch.rows, request_id=self.request_id)
            body, content = self._render_ok(part)
        except (ModelyardError, ValueError) as e:
            log.warning("task %s: batched reply unusable for this member (%s); own call", self.ctx.task_id, e)
            return None
        self.role = "member"
        self._finish(200)
        return msg.immediate(200, body, [*content, *self.ctx.task_headers()])

    def _backend(self) -> Backend:
        assert self.gw.image_backend is not None  # Gateway.build picks one wherever a model has `vision`
        return self.gw.image_backend

    # -- response ----------------------------------------------------------------------------
    def _error_body(self, status: int, message: str) -> bytes:
        return render_error_body(self.ctx.protocol, status, message, default_type(status))

    def _fail_batch(self, reason: str) -> None:
        if self.role == "leader" and self.batch is not None:
            self._batcher.fail(self.batch, reason)

    def _immediate_error(self, status: int, message: str) -> msg.ProcessingResponse:
        """The upstream's own headers, rewritten, with our body in place of its (absent) one: an
        immediate response here would be a local reply Envoy stamps with the route's internal
        x-modelyard-upstream-* headers after the session has had its say."""
        self._fail_batch(message)
        self._finish(status)
        body = self._error_body(status, message)
        return msg.response_headers_replacing_body(
            [(":status", str(status)), _JSON, ("content-length", str(len(body))), *self.ctx.task_headers()],
            _STRIP_RESPONSE, body)

    def response_headers(self, status: int,
                         headers: dict[str, str]) -> msg.ProcessingResponse | Awaitable[msg.ProcessingResponse]:
        self.upstream_status = status
        gs = kserve.grpc_status_from_headers(headers) if self.grpc else None
        if gs is not None:  # trailers-only: no body follows
            if gs.code != 0 and self._refused_text_batch(gs.http_status):
                return self._own_call(headers.get(UPSTREAM_HOST_HEADER, ""), gs.code)
            if gs.code != 0:
                log.info("task %s: upstream answered gRPC status %d: %r", self.ctx.task_id, gs.code,
                         gs.message[:2000])
                return self._immediate_error(gs.http_status, sanitize(gs.message) or f"upstream gRPC status {gs.code}")
            return self._immediate_error(502, "upstream ended without a reply")
        set_h = self.ctx.task_headers()
        if status != 200:
            self.error_status = upstream_error_status(status) if status >= 400 else 502
            self._fail_batch(f"upstream answered HTTP {status}")
            set_h += [(":status", str(self.error_status)), _JSON]
            return msg.response_headers(set_h, _STRIP_RESPONSE)
        if not self.grpc:
            # kserve-rest: the reply is rewritten (the gateway's model name) in the body step.
            self.rest_header_length = headers.get(kserve_binary.HEADER)
            return msg.response_headers(set_h, ["content-length"])
        return msg.response_headers([*set_h, _JSON], _STRIP_RESPONSE)

    def _refused_text_batch(self, http_status: int) -> bool:
        """The merged text call was refused for its contents (someone's input may be the bad one)."""
        return (self.role == "leader" and self.batch is not None and self.job is not None
                and self.job.text is not None and len(self.batch.members) > 1 and refused(http_status))

    async def _own_call(self, host: str, code: int) -> msg.ProcessingResponse:
        """The leader's own rows, straight at the deployment (its stream spent its upstream call on the
        merged one); every other member went back to its own call through its own stream."""
        choice = self.call.choice
        assert choice is not None and self.request is not None
        self._fail_batch(f"the merged call was refused (gRPC status {code})")
        self.role, self.batch = "single", None
        log.info("task %s: merged KServe call refused (gRPC status %d); own call", self.ctx.task_id, code)
        dep = choice.deployment
        endpoint = host if host in dep.endpoints else dep.endpoints[0]
        try:
            resp = await self.gw.kserve_probe.infer(dep, endpoint, self.request, dep.timeout_ms / 1000)
            body, content = self._render_ok(resp)
        except grpc.aio.AioRpcError as e:
            own = e.code().value[0]
            return self._immediate_error(kserve.grpc_status_to_http(own),
                                         sanitize(e.details() or "") or f"upstream gRPC status {own}")
        except (ModelyardError, ValueError) as e:
            return self._immediate_error(502, f"upstream sent an unusable reply: {getattr(e, 'message', str(e))}")
        self._finish(200)
        return msg.response_headers_replacing_body(
            [(":status", "200"), *content, ("content-length", str(len(body))), *self.ctx.task_headers()],
            _STRIP_RESPONSE, body)

    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse:
        if self.error_status:
            log.info("task %s: upstream answered HTTP %d: %s", self.ctx.task_id, self.upstream_status,
                     log_excerpt(chunk))
            message = client_text(self.upstream_status, chunk, self.ctx.task_id)
            return self._body_reply(self.error_status, self._error_body(self.error_status, message))
        if not self.grpc:
            return self._rest_reply(chunk)
        if not chunk:
            self._fail_batch("empty reply")
            return self._body_reply(502, self._error_body(502, "upstream ended without a reply"))
        try:
            resp = kserve.parse_grpc_response(chunk)
            resp = self._leader_share(resp)
            with self.ctx.span("translate response"):
                body, content = self._render_ok(resp)
        except (ModelyardError, ValueError) as e:
            self._fail_batch(str(e))
            text = getattr(e, "message", str(e))
            return self._body_reply(502, self._error_body(502, f"upstream sent an unusable reply: {text}"))
        return self._body_reply(200, body, content)

    def _rest_reply(self, body: bytes) -> msg.ProcessingResponse:
        """A REST upstream's reply, JSON or binary, passed on under the gateway's model name."""
        if self.role == "leader" and self.batch is not None:
            self._batcher.complete(self.batch, None)  # a lone text batch that went as sent: its key frees up
        try:
            length = kserve_binary.header_length({kserve_binary.HEADER: self.rest_header_length}
                                                 if self.rest_header_length is not None else {})
            parsed = self.parsed
            if length is None and parsed is not None and (parsed.binary_all or parsed.binary_outputs):
                # The upstream answered JSON to a caller that asked for binary outputs: convert.
                resp = kserve.parse_rest_reply(body, None)
                resp.model_name = self.client_model
                body, length = kserve.render_infer_reply(resp, parsed)
            else:
                body, length = kserve.rename_rest_reply(body, length, self.client_model)
        except (ModelyardError, kserve_binary.FramingError) as e:
            text = getattr(e, "message", str(e))
            return self._body_reply(502, self._error_body(502, f"upstream sent an unusable reply: {text}"))
        return self._body_reply(200, body, _content_headers(length))

    def _body_reply(self, status: int, body: bytes, content: ContentHeaders | None = None) -> msg.ProcessingResponse:
        self._finish(status)
        headers = [(":status", str(status)), ("content-length", str(len(body))), *(content or [_JSON])]
        return msg.response_body(headers, [] if content and len(content) > 1 else [kserve_binary.HEADER],
                                 body=body)

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        self._finish(self.error_status or 200)
        return msg.response_trailers(remove=["grpc-status", "grpc-message", "grpc-status-details-bin"])

    # -- accounting --------------------------------------------------------------------------
    def _finish(self, status: int, *, upstream_answered: bool = True) -> None:
        """`status` came from the upstream's answer (or its slice of a batch), unless it never answered."""
        self.call.finish(status, upstream_ok=status < 500 if upstream_answered else None,
                         response_model=self.upstream_model or None)

    def defer(self) -> None:
        self.call.release()

    def close(self) -> None:
        if self.member is not None and self.role != "member":
            # Still waiting (dropped from its batch) or the leader (its members fall back).
            self._batcher.leave(self.member)
        if self.call.pending:
            # No response headers came: Envoy answers upstream failures itself (they reach
            # response_headers), so a stream ending here means the client went away.
            self._finish(499, upstream_answered=False)


class KServeInferFlow(_VisionFlow):
    """`POST /v2/models/{m}[/versions/{v}]/infer` (REST JSON or binary tensors) to a KServe gRPC or
    REST upstream."""

    task_type = "infer"
    needs_vision = False  # a tensor, not images: any KServe model may take it

    def __init__(self, gw: Gateway, ctx: RequestContext):
        super().__init__(gw, ctx)
        self.rest_body = b""  # a REST deployment's call: the caller's body, sent as is when it goes alone
        self.rest_binary = False

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx = self.ctx
        name, version = ctx.path_model or "", ctx.path_version or ""
        self.model = self.gw.catalog.model_for(ctx.tenant, name)
        self.client_model = name
        try:
            header_length = kserve_binary.header_length(ctx.headers)
        except kserve_binary.FramingError as e:
            raise kserve.KServeError(str(e)) from None
        self.parsed = parsed = await asyncio.to_thread(kserve.parse_request, body, name, version, header_length)
        req = parsed.request
        choice = await self._route(name)
        dep = choice.deployment
        if dep.protocol == "kserve-rest":
            self.rest_body, self.rest_binary = body, header_length is not None
            req.model_name = self.upstream_model
            self.request, self.request_id = req, req.id
            # A text model's tensors batch to a REST deployment too (the extproc makes the merged call).
            job = self._batch_job(req) if self.model.vision is None else None
            return await self._dispatch(job) if job is not None else await self._go_alone()
        if not self.grpc:
            raise UpstreamError(f"deployment {dep.cluster} speaks {dep.protocol}, not KServe")
        req.model_name = self.upstream_model
        self.request, self.request_id = req, req.id
        job = self._batch_job(req)
        if job is None:
            await self._own_slot()  # not batchable (its shape, datatype, parameters or outputs): alone
            return self._send(kserve.encode_infer_request(req))
        return await self._dispatch(job)

    def _batch_job(self, req: Any) -> Job | None:
        """The request as one batchable tensor, or None when it must go alone (as sent)."""
        v = self.model.vision
        if v is None and self._policy() is not None:
            # A text model's tensor: merged as raw rows (token ids padded to a bucket where configured).
            rows = kserve.tensor_rows(req, self.model.batching.pad)
            return Job(rows=rows.rows, text=rows) if rows is not None else None
        if v is None or self._policy() is None or len(req.inputs) != 1 or req.parameters:
            return None
        t = req.inputs[0]
        ti = v.input
        shape = list(t.shape)
        if (t.name != ti.name or t.datatype != ti.datatype or t.parameters or len(shape) != 4
                or shape[1:] != [3, ti.height, ti.width] or shape[0] < 1):
            return None
        if any(o.name != v.output or o.parameters for o in req.outputs) or len(req.outputs) > 1:
            return None
        dtype = np.dtype(kserve.DTYPES[t.datatype])
        # A gRPC caller's tensor is unchecked so far (typed contents, or a size that lies): it goes alone.
        if len(req.raw_input_contents) != 1 or len(req.raw_input_contents[0]) != math.prod(shape) * dtype.itemsize:
            return None
        tensor = np.frombuffer(req.raw_input_contents[0], dtype=dtype).reshape(shape)
        return Job(rows=shape[0], tensor=tensor)

    async def _single_body(self) -> bytes:
        return kserve.encode_infer_request(self.request)

    async def _send_alone(self) -> msg.ProcessingResponse:
        if self.grpc:
            return await super()._send_alone()
        # A REST deployment: the caller's body as sent; only the path names the upstream model.
        path = kserve.rest_infer_path(self.upstream_model, self.ctx.path_version or None)
        if not self.rest_binary:
            return self._send(self.rest_body, path, "application/json")
        assert self.call.choice is not None  # routed before anything goes upstream
        if await self.gw.kserve_probe.takes_binary(self.call.choice.deployment):
            return self._send(self.rest_body, path, kserve_binary.CONTENT_TYPE)
        # An upstream without the extension gets the same tensors as JSON (the reply is converted back).
        body, _ = await asyncio.to_thread(kserve.infer_request_rest, self.request, binary=False)
        return self._send(body, path, "application/json", strip=[kserve_binary.HEADER])

    def _render_ok(self, resp: Any) -> tuple[bytes, ContentHeaders]:
        resp.model_name = self.client_model
        body, length = kserve.render_infer_reply(resp, self.parsed)
        return body, _content_headers(length)


class ClassifyFlow(_VisionFlow):
    """`POST /v1/images/classify` (multipart: `model`, `image` x N, optional `top_k`)."""

    task_type = "image-classification"

    def __init__(self, gw: Gateway, ctx: RequestContext):
        super().__init__(gw, ctx)
        self.form: Any = None

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx = self.ctx
        limits = MultipartLimits(max_body_bytes=self.gw.config.extproc.max_body_bytes)
        self.form = form = read_classify_form(parse_multipart(body, ctx.headers.get("content-type"), limits))
        ctx.requested_model = form.model
        self.model = model = self.gw.catalog.model_for(ctx.tenant, form.model)
        v = model.vision
        if v is None:
            raise ClientError(f"model `{form.model}` does not classify images")
        budget = ImageBudget(v.max_images, v.max_image_pixels, v.max_request_pixels, v.max_decoded_bytes)
        # Headers only (a thread: a crafted JPEG can hold many markers); bombs and over-budget
        # requests are refused here, before routing, admission or any decoding.
        await asyncio.to_thread(check_images, form.images, budget)
        choice = await self._route(form.model)
        if not self.grpc:
            raise UpstreamError(f"deployment {choice.deployment.cluster} speaks {choice.deployment.protocol}; "
                                "image classification needs kserve-grpc")
        # Pixels are decoded only for an admitted request.
        try:
            images = await asyncio.to_thread(decode_checked, form.images, budget)
        except ImageError as e:
            self._finish(e.status, upstream_answered=False)  # a corrupt body past a valid header: the caller's fault
            raise
        return await self._dispatch(Job(rows=len(images), images=images))

    async def _single_body(self) -> bytes:
        v = self.model.vision
        images = self.job.images if self.job is not None else None
        tensor = await asyncio.to_thread(self._backend().preprocess, images or [], _spec(v.input))
        req = kserve.build_classify_request(self.upstream_model, tensor, v.input, output=v.output,
                                            request_id=self.ctx.task_id)
        return kserve.encode_infer_request(req)

    def _render_ok(self, resp: Any) -> tuple[bytes, ContentHeaders]:
        v = self.model.vision
        results = kserve.parse_classify_response(resp, v.labels, self.form.top_k or 5,
                                                 expected=len(self.form.images), output=v.output)
        return (kserve.render_classify_response(self.form.model, results, [u.filename for u in self.form.images]),
                [_JSON])
