"""Embeddings requests: OpenAI `/v1/embeddings`, Gemini `:embedContent` / `:batchEmbedContents`.

Routed (task type `embedding`), rate-limited and metered like chat. An OpenAI client reaching an
OpenAI upstream keeps its own bytes (model name swapped) and gets the upstream's answer as is;
every other pair goes through `adapters.embeddings`. Embeddings go to the deployment's own
cluster, not its failover aggregate: a translation hop re-renders chat, not embeddings.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable

from adapters import embeddings, upstream_errors
from adapters.embeddings import EmbeddingRequest, EmbeddingResponse, EmbeddingRoute, Shape
from adapters.embeddings.batch import merge_requests, split_response
from adapters.internal import UpstreamRequest, Usage
from adapters.upstream_errors import log_excerpt
from contracts.envoy_names import UPSTREAM_HOST_HEADER
from contracts.errors import ModelyardError, default_type
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.context import RequestContext
from extproc.errors import render_error_body
from extproc.flows import answer_limit, embedding_batch
from extproc.flows.embedding_batch import TextJob
from extproc.flows.offload import inline, sized
from extproc.flows.upstream import ROUTE_ANSWER_HEADERS, UpstreamCall, upstream_error_status
from extproc.gateway import Gateway
from extproc.vision.batching import Batch, Batcher, Member

# A member waits for its batch's reply at most this long, then makes its own call: under Envoy's
# 10 s ext_proc message timeout (the image batcher's bound).
MEMBER_WAIT_S = 8.0

log = logging.getLogger("modelyard.embeddings")


class EmbeddingFlow:
    def __init__(self, gw: Gateway, ctx: RequestContext, route: EmbeddingRoute):
        self.gw = gw
        self.ctx = ctx
        self.shape: Shape = route.shape
        self.request: EmbeddingRequest | None = None
        self.call = UpstreamCall(gw, ctx, counts_output=False)
        self.upstream = ""  # the chosen deployment's protocol
        self.status = 0
        self.client_status = 0
        self.usage: Usage | None = None
        self.upstream_failed = False
        self.member: Member | None = None  # in a batch (docs/batching.md "Embeddings")
        self.batch: Batch | None = None  # the batch this stream carries upstream, as its leader
        self.alone = False  # the leader's merged call was refused: it answers from its own call
        # The leader's split of the merged answer, or why there is none: made where the answer is
        # read (maybe a worker thread), handed to the members on the loop (`_settle_batch`).
        self._parts: list[EmbeddingResponse] | None = None
        self._batch_failure = ""
        self.upstream_host = ""
        self._solo: Batch | None = None  # a batch of one that this stream carries as its own call

    @property
    def passthrough(self) -> bool:
        # A batch's leader reads and splits the merged answer: nothing passes through it.
        return self.batch is None and not self.alone and embeddings.passes_through(self.shape, self.upstream)

    # -- request ---------------------------------------------------------------------------
    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx = self.ctx
        parse = functools.partial(embeddings.parse_request, self.shape, body, path_model=ctx.path_model)
        req = await sized(parse, len(body))
        self.request = req
        self.call.choice = choice = await self.gw.dispatcher.choose_embedding(
            ctx, req.model, embeddings.estimate_tokens(req), embeddings.longest_input_tokens(req), slot=False)
        dep = choice.deployment
        self.upstream = dep.protocol
        policy = embedding_batch.batch_policy(choice.model, dep, deferred=ctx.deferred)
        if policy is None or self.gw.batcher is None:
            # A call that goes alone takes a slot; batch members share one upstream call, so they do not queue.
            await self.gw.dispatcher.wait_for_slot(ctx, choice)
        auth = await self.call.authorize()
        ctx.response_headers += choice.response_headers()
        if policy is not None and self.gw.batcher is not None:
            self.member = self.gw.batcher.join(embedding_batch.batch_key(choice.model, dep, req), policy,
                                               TextJob(req), len(req.inputs), arrived=ctx.started)
        if self.member is not None:
            answer = await self._batched(self.gw.batcher, self.member, auth.credential)
            if answer is not None:
                return answer
        if self._solo is None:
            # Its own call after all (the batcher declined it, or its batch fell back): a slot, like any call.
            await self.gw.dispatcher.own_call_slot(ctx, choice)
        render = functools.partial(self._upstream_request, body, req, dep.upstream_model or choice.model.name,
                                   auth.credential)
        with ctx.span("translate request"):
            rendered = await sized(render, len(body))
        # The deployment's own cluster: a failover hop re-renders chat, not embeddings.
        return self.call.request(rendered.path, rendered.body, rendered.headers, cluster=dep.cluster)

    async def _batched(self, batcher: Batcher | None, member: Member,
                       credential: str | None) -> msg.ProcessingResponse | None:
        """Lead the batch (send the merged inputs), or answer from the leader's split reply; None:
        fall back to this caller's own call."""
        assert batcher is not None and self.call.choice is not None
        with self.ctx.span("batching") as span:
            outcome = await batcher.wait(member, MEMBER_WAIT_S)
            if span is not None:
                span.set_attributes({"modelyard.batch.role": outcome.role, "modelyard.batch.rows": member.rows})
        batch = outcome.batch
        if outcome.role == "leader" and batch is not None and len(batch.members) == 1:
            self._solo = batch  # alone in its batch: its own call, as sent (no merge, no split)
            return None
        if outcome.role == "leader" and batch is not None:
            self.batch = batch
            dep, model = self.call.choice.deployment, self.call.choice.model
            try:
                merged = merge_requests([m.payload.request for m in batch.members])
                up = embeddings.render_request(dep.protocol, merged, upstream_model=dep.upstream_model or model.name,
                                               credential=credential)
            except BaseException:
                batcher.fail(batch, "the leader could not build the merged request")
                raise
            return self.call.request(up.path, up.body, up.headers, cluster=dep.cluster)
        if outcome.role == "result" and batch is not None:
            return self._member_answer(batch, outcome.response)
        log.info("task %s: embeddings batch fallback (%s)", self.ctx.task_id, outcome.reason)
        return None

    def _member_answer(self, batch: Batch, parts: list[EmbeddingResponse]) -> msg.ProcessingResponse | None:
        """This member's rows of the merged answer, as an immediate response (None: fall back)."""
        req, choice = self.request, self.call.choice
        assert req is not None and choice is not None and self.member is not None
        own = parts[batch.members.index(self.member)]
        try:
            body = embeddings.render_response(self.shape, own, model=choice.model.name, req=req)
        except ModelyardError as e:
            log.warning("task %s: batched reply unusable for this member (%s); own call", self.ctx.task_id, e)
            return None
        self.status = self.client_status = 200
        self.usage = Usage(own.input_tokens if own.input_tokens is not None else embeddings.estimate_tokens(req), 0)
        self._finish()
        return msg.immediate(200, body, [("content-type", "application/json"), *self.ctx.task_headers()])

    def _upstream_request(self, body: bytes, req: EmbeddingRequest, upstream_model: str,
                          credential: str | None) -> UpstreamRequest:
        if self.passthrough:
            return embeddings.passthrough_request(body, upstream_model=upstream_model, credential=credential)
        return embeddings.render_request(self.upstream, req, upstream_model=upstream_model, credential=credential)

    # -- response --------------------------------------------------------------------------
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        self.status = self.client_status = status
        set_h = self.ctx.task_headers()
        remove = list(ROUTE_ANSWER_HEADERS)
        self.upstream_host = headers.get(UPSTREAM_HOST_HEADER, "")
        if self.batch is not None and status != 200:
            self._fail_batch(f"upstream answered HTTP {status}")
            if embedding_batch.refused(status) and len(self.batch.members) > 1:
                # Someone's input may be the bad one: the leader's own call decides its answer (body step).
                self.alone = True
                return msg.response_headers([*set_h, ("content-type", "application/json")],
                                            [*remove, "content-length"])
        limit = self.gw.config.extproc.max_body_bytes
        if (nbytes := answer_limit.oversized(headers, limit)) is not None:
            return self._oversized(status, nbytes, limit, set_h, remove)
        if status >= 400:
            self.upstream_failed = status >= 500
            self.client_status = upstream_error_status(status)
            set_h.append((":status", str(self.client_status)))
        if status >= 400 or not self.passthrough:
            remove.append("content-length")
            set_h.append(("content-type", "application/json"))
        return msg.response_headers(set_h, remove)

    def _oversized(self, status: int, nbytes: int, limit: int, set_h: list[tuple[str, str]],
                   remove: list[str]) -> msg.ProcessingResponse:
        """Past max_body_bytes: an OpenAI caller of an OpenAI upstream takes the answer as sent;
        anything to translate (or an error to rewrite) is a 502 naming the limit."""
        choice = self.call.choice
        assert choice is not None  # routed before anything went upstream
        self._fail_batch(f"the merged answer ({nbytes} bytes) is past max_body_bytes")
        model, cluster = choice.model.name, choice.deployment.cluster
        if status < 400 and self.passthrough:
            answer_limit.count(model, cluster, "passthrough")
            req = self.request
            assert req is not None
            self.usage = Usage(embeddings.estimate_tokens(req), 0)  # the body, and its usage, pass us by
            self._finish()
            return msg.response_headers(set_h, remove, skip_body=True)
        answer_limit.count(model, cluster, "refused")
        self.upstream_failed = status >= 500
        self.client_status = 502
        self._finish()
        return answer_limit.refusal(self.ctx, nbytes, limit, self.upstream)

    def response_body(self, chunk: bytes,
                      end_of_stream: bool) -> msg.ProcessingResponse | Awaitable[msg.ProcessingResponse]:
        if self.alone:
            return self._own_call(chunk)
        if not inline(len(chunk)):
            return self._large_body(chunk)
        return self._replaced(self._whole_body(chunk))

    async def _own_call(self, merged_answer: bytes) -> msg.ProcessingResponse:
        """The merged call was refused: this leader's own inputs alone, at the deployment itself."""
        req, choice = self.request, self.call.choice
        assert req is not None and choice is not None
        log.info("task %s: merged embeddings call refused (%d: %s); own call", self.ctx.task_id, self.status,
                 log_excerpt(merged_answer))
        dep = choice.deployment
        self.batch = None  # from here this stream is a call of its own
        up = embeddings.render_request(dep.protocol, req, upstream_model=dep.upstream_model or choice.model.name,
                                       credential=self.call.auth.credential)
        endpoint = self.upstream_host if self.upstream_host in dep.endpoints else dep.endpoints[0]
        self.status, answer = await embedding_batch.call_alone(dep, up, endpoint)
        self.client_status = upstream_error_status(self.status) if self.status >= 400 else self.status
        self.upstream_failed = self.status >= 500
        body = await asyncio.to_thread(self._whole_body, answer) if not inline(len(answer)) else self._whole_body(answer)
        self._finish()
        assert body is not None  # translated (no passthrough once alone)
        return msg.replaced_body(body, self.client_status)

    async def _large_body(self, chunk: bytes) -> msg.ProcessingResponse:
        """A large answer (2048 x 1536 floats) is decoded, translated and encoded in a worker thread."""
        return self._replaced(await asyncio.to_thread(self._whole_body, chunk))

    def _replaced(self, body: bytes | None) -> msg.ProcessingResponse:
        self._settle_batch()
        self._finish()
        return msg.replaced_body(body, self.client_status if self.client_status != self.status else None)

    def _whole_body(self, body: bytes) -> bytes | None:
        req, choice = self.request, self.call.choice
        assert req is not None and choice is not None  # set before anything went upstream
        if self.status >= 400:
            log.info("task %s: upstream %s answered %d: %s", self.ctx.task_id, choice.deployment.cluster,
                     self.status, log_excerpt(body))
            return render_error_body(self.ctx.protocol, self.client_status,
                                     upstream_errors.client_text(self.status, body, self.ctx.task_id),
                                     default_type(self.client_status))
        with self.ctx.span("translate response"):
            return self._translate(body, req, choice)

    def _translate(self, body: bytes, req: EmbeddingRequest, choice: Choice) -> bytes | None:
        try:
            if self.passthrough:
                tokens = embeddings.openai_usage(body)
                self.usage = Usage(tokens if tokens is not None else embeddings.estimate_tokens(req), 0)
                return None
            resp = embeddings.parse_response(self.upstream, body)
            if self.batch is not None:
                resp = self._leader_share(self.batch, resp)
            out = embeddings.render_response(self.shape, resp, model=choice.model.name, req=req)
        except ModelyardError as e:
            self._batch_failure = e.message
            self.client_status = 502
            self.upstream_failed = True
            return render_error_body(self.ctx.protocol, 502, f"upstream sent an unreadable reply: {e.message}",
                                     "api_error")
        # Gemini reports no usage for embeddings: meter the estimate charged on arrival.
        tokens = resp.input_tokens if resp.input_tokens is not None else embeddings.estimate_tokens(req)
        self.usage = Usage(tokens, 0)
        limit = self.gw.config.extproc.max_body_bytes
        if len(out) > limit:  # base64 vectors grow into JSON floats: past the limit, nothing sends it on
            answer_limit.count(choice.model.name, choice.deployment.cluster, "refused")
            self.client_status = 502
            return render_error_body(self.ctx.protocol, 502, answer_limit.refusal_text(
                len(out), limit, self.upstream, self.ctx.protocol, translated=True), "api_error")
        return out

    def _leader_share(self, batch: Batch, resp: EmbeddingResponse) -> EmbeddingResponse:
        """The merged answer split by member (kept for the others), the leader's own part returned.
        Raises (ModelyardError) for an answer of the wrong size: no member gets any of it."""
        assert self.member is not None
        parts = split_response(resp, [m.payload.request for m in batch.members])
        self._parts = parts
        return parts[batch.members.index(self.member)]

    def _settle_batch(self) -> None:
        """On the loop: every other member gets its part of the merged answer, or falls back."""
        if self.batch is None or self.gw.batcher is None:
            return
        if self._parts is not None:
            self.gw.batcher.complete(self.batch, self._parts)
        else:
            self.gw.batcher.fail(self.batch, self._batch_failure or "the merged answer was unusable")

    def _fail_batch(self, reason: str) -> None:
        if self.batch is not None and self.gw.batcher is not None:
            self.gw.batcher.fail(self.batch, reason)

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        self._finish()
        return msg.response_trailers()

    # -- accounting ------------------------------------------------------------------------
    def _finish(self, *, upstream_answered: bool = True) -> None:
        if self._solo is not None and self.gw.batcher is not None:
            self.gw.batcher.complete(self._solo, [])  # its key is free again (nobody else waits on it)
            self._solo = None
        self.call.finish(self.client_status or self.status, usage=self.usage,
                         upstream_ok=(not self.upstream_failed) if upstream_answered and self.status else None)

    def defer(self) -> None:
        self.call.release()

    def close(self) -> None:
        if self.member is not None and self.gw.batcher is not None and not self.call.finished:
            # Still waiting (dropped from its batch) or the leader cut short (its members fall back).
            self.gw.batcher.leave(self.member)
        if self.call.pending:
            self.client_status = 499  # the client went away or the gateway failed the request
            self._finish(upstream_answered=False)
