"""LLM chat requests: parse in the client's protocol, route, render in the upstream's, and back.

Same-protocol requests keep the client's body byte for byte (only the model name may change), so
provider-specific fields survive; cross-protocol requests go through the internal format.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable

from adapters import controls, upstream_errors
from adapters.injected_usage import InjectedUsageFilter
from adapters.internal import ChatRequest, ChatResponse, RenderOptions, StreamError, StreamEvent, StreamStart, Usage
from adapters.output_cap import with_output_cap
from adapters.protocol import ChatProtocol, StreamDecoder
from adapters.reasoning import without_reasoning
from adapters.registry import PROTOCOLS, StreamTranslator, translate_stream
from adapters.stream_usage import StreamUsage
from adapters.upstream_errors import log_excerpt
from contracts.envoy_names import (
    CLUSTER_HEADER,
    DROPPED_PARAMS_HEADER,
    OUTPUT_CLAMPED_HEADER,
    UPSTREAM_ATTEMPTS_HEADER,
    UPSTREAM_HOST_HEADER,
)
from contracts.errors import ClientError, ModelyardError
from contracts.params import effective_drop_params
from extproc import messages as msg
from extproc.admission.choice import Choice
from extproc.cache.metrics import SAVED
from extproc.cache.part import CacheStep, ResponseCache
from extproc.cache.replay import Assembly
from extproc.cache.replay import events as replay_events
from extproc.context import RequestContext
from extproc.errors import render_error_body
from extproc.flows import answer_limit
from extproc.flows.guard import answer_text, guard_for, record, released_text
from extproc.flows.offload import inline, sized
from extproc.flows.upstream import ROUTE_ANSWER_HEADERS, UpstreamCall, upstream_error_status
from extproc.gateway import Gateway
from extproc.replicas.prefix import prompt_text
from extproc.telemetry.metrics import DROPPED_PARAMS
from guardrails import CallGuard, GuardrailBlocked, StreamGuard, rewrite_json
from guardrails.stream import segments

log = logging.getLogger("modelyard.chat")

# Streamed answers: SSE, or Bedrock's binary eventstream (ConverseStream).
_STREAM_TYPES = ("text/event-stream", "application/vnd.amazon.eventstream")
# Prompts past this are put through their guardrail checks in a worker thread (about 0.1 us a byte
# for a typical policy set: 16 KB is a couple of ms on the event loop at most).
GUARD_INLINE_BYTES = 16 * 1024


class ChatFlow:
    metered = True  # a translation hop's call is the outer request's, metered there

    def __init__(self, gw: Gateway, ctx: RequestContext):
        self.gw = gw
        self.ctx = ctx
        self.client = PROTOCOLS[ctx.protocol]
        self.request: ChatRequest | None = None
        self.call = UpstreamCall(gw, ctx, metered=self.metered)
        self.upstream: ChatProtocol = self.client  # the chosen deployment's protocol, set when sent
        self.translator: StreamTranslator | InjectedUsageFilter | None = None
        self.decoder: StreamDecoder | None = None
        self.meter = StreamUsage()  # a passthrough stream's usage (a translated one has its own)
        self.status = 0
        self.client_status = 0
        self.streaming = False
        self.first_chunk_at: float | None = None
        self.usage: Usage | None = None
        self.upstream_failed = False  # the upstream's own failure: 5xx, an unreadable reply, a cut stream
        # The protocol the answer arrives in: the chosen deployment's, even when Envoy failed over
        # to a peer through a translation hop (the hop translates back to this protocol).
        self.wire: str | None = None
        # We asked the upstream for stream usage the client did not ask for: strip it on the way back.
        self.usage_injected = False
        self.response_model: str | None = None  # as the upstream reported it (tracing's gen_ai.response.model)
        # The response cache (docs/cache.md): set only for a model with a policy whose answer may be kept.
        self.cache_step: CacheStep | None = None
        self.answer: ChatResponse | None = None  # a whole plain answer, as the caller got it
        self.assembly: Assembly | None = None  # a stream's events, gathered to keep
        self.recorder: StreamDecoder | None = None  # a translated stream's upstream events, for the assembly
        self.guard: CallGuard | None = None  # guardrails (docs/guardrails.md): None unless a policy covers the call
        self.stream_guard: StreamGuard | None = None
        self.guarded_body: bytes | None = None  # the client's body with input redactions, where any

    @property
    def translating(self) -> bool:
        return self.wire is not None and self.wire != self.ctx.protocol

    # -- request ---------------------------------------------------------------------------
    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx = self.ctx
        self.client.check_query(ctx.query, stream_hint=ctx.stream_hint)
        req = await self._parse(body)
        if (guard := guard_for(self.gw, ctx, req)) is not None:
            if req.choices > 1 and guard.checks.guards_output:
                raise ClientError("several answers to one call (n or candidateCount > 1): this model's guardrails "
                                  "check one answer a call; ask for one")
            self.guard = guard
            req = self.request = await self._guarded_request(guard, req, body)
            if guard.checks.remote_inputs:
                try:
                    await self.gw.guard_hooks.check_input(guard, req, ctx.tenant_name, ctx.task_id, self.gw.config)
                finally:
                    record(guard, ctx)
        if ctx.deferred and req.stream:
            raise ClientError("Prefer: respond-async answers with a task, not a stream: "
                              "drop `stream` or the preference")
        cache = self.gw.response_cache
        if cache is None:  # no model has a cache policy: not one step more
            self.call.choice = await self.gw.dispatcher.choose_chat(ctx, req)
        elif (hit := await self._cached(cache, req, body)) is not None:
            return hit
        await self.call.authorize()
        return self._send(body, req)

    async def _guarded_request(self, guard: CallGuard, req: ChatRequest, body: bytes) -> ChatRequest:
        """The input checks: a block raises (a 400 in the caller's protocol), redactions come back; a
        large prompt is checked in a worker thread (the checks read every character)."""
        def work() -> ChatRequest:
            out = guard.request(req)
            if guard.rewrites:  # the same replacements in the body's strings, for a same-protocol send
                self.guarded_body = rewrite_json(body, guard.rewrites)
            return out
        try:
            return work() if len(body) <= GUARD_INLINE_BYTES else await asyncio.to_thread(work)
        finally:
            record(guard, self.ctx)

    def _guarded_answer(self, resp: ChatResponse) -> ChatResponse | bytes:
        """The output checks on a whole answer: the answer to send, or a block's error body."""
        guard = self.guard
        if guard is None or not guard.checks.guards_output:
            return resp
        try:
            return guard.response(resp)
        except GuardrailBlocked as e:
            self.client_status = e.status
            return render_error_body(self.ctx.protocol, e.status, e.message, e.type)
        finally:
            record(guard, self.ctx)

    async def _cached(self, cache: ResponseCache, req: ChatRequest, body: bytes) -> msg.ProcessingResponse | None:
        """Route, then ask the cache where the model has a policy: a hit is the answer (an immediate
        response, nothing upstream); else admit as usual, and keep the step for the response side."""
        ctx, dispatcher = self.ctx, self.gw.dispatcher
        assert ctx.tenant is not None
        choice = dispatcher.route_chat(ctx, req)
        policy = choice.model.cache
        if policy is None or ctx.deferred:  # a task's 202 is no answer to keep; its replay may hit
            await dispatcher.admit_chat(ctx, choice, req)
            self.call.choice = choice
            return None
        step = await cache.begin(policy, choice.model.name, ctx.tenant.name,
                                 ctx.caller.key_id if ctx.caller is not None else None, ctx.protocol, req, body,
                                 ctx.headers.get("cache-control"),
                                 self.gw.config.model(policy.embedding_model) if policy.embedding_model else None)
        ctx.response_headers.append(step.header)
        if step.hit is not None:
            await dispatcher.admit_hit(ctx, choice)
            if self.guard is not None and self.guard.checks.remote_outputs:
                return await self._remote_checked_hit(choice, req, step.hit)
            return self._hit(choice, req, step.hit)
        await dispatcher.admit_chat(ctx, choice, req)
        self.call.choice = choice
        self.cache_step = step if step.writes else None
        return None

    async def _remote_checked_hit(self, choice: Choice, req: ChatRequest, resp: ChatResponse) -> msg.ProcessingResponse:
        """A stored answer under remote output checks: asked about as a fresh one would be."""
        guard, ctx = self.guard, self.ctx
        assert guard is not None
        try:
            await self.gw.guard_hooks.check_output(guard, answer_text(resp), ctx.requested_model or "",
                                                   ctx.tenant_name, ctx.task_id, self.gw.config)
        except GuardrailBlocked as e:
            self.gw.accountant.record_hit(ctx, choice, latency_s=time.monotonic() - ctx.started, usage=resp.usage)
            return msg.immediate(e.status, render_error_body(ctx.protocol, e.status, e.message, e.type),
                                 [("content-type", "application/json"), *ctx.task_headers()])
        finally:
            record(guard, ctx)
        return self._hit(choice, req, resp)

    def _hit(self, choice: Choice, req: ChatRequest, resp: ChatResponse) -> msg.ProcessingResponse:
        """The stored answer in the caller's protocol: a body, or (asked for a stream) the whole
        stream as events in one body; metered as a hit."""
        ctx = self.ctx
        guarded = self._guarded_answer(resp)
        if isinstance(guarded, bytes):  # a stored answer a policy now blocks: the block, as for a fresh one
            self.gw.accountant.record_hit(ctx, choice, latency_s=time.monotonic() - ctx.started, usage=resp.usage)
            return msg.immediate(self.client_status, guarded, [("content-type", "application/json"),
                                                               *ctx.task_headers()])
        resp = guarded
        if req.stream:
            out = self.client.StreamEncoder(model=req.model, request=req).encode(replay_events(resp))
            ctype = "text/event-stream"
        else:
            out = self.client.render_response(resp, model=choice.model.name, request=req)
            ctype = "application/json"
        saved = self.gw.accountant.record_hit(ctx, choice, latency_s=time.monotonic() - ctx.started, usage=resp.usage)
        if saved > 0:
            SAVED.labels(choice.model.name, ctx.tenant_name).inc(saved)
        ctx.response_headers += choice.response_headers()
        return msg.immediate(200, out, [("content-type", ctype), *ctx.task_headers()])

    async def _parse(self, body: bytes) -> ChatRequest:
        ctx = self.ctx
        parse = functools.partial(self.client.parse_request, body, path_model=ctx.path_model,
                                  stream_hint=ctx.stream_hint)
        req = await sized(parse, len(body))
        self.request = req
        ctx.requested_model = req.model
        return req

    def _send(self, body: bytes, req: ChatRequest) -> msg.ProcessingResponse:
        """The upstream request for the chosen deployment: path, the adapter's headers, body."""
        ctx, choice = self.ctx, self.call.choice
        assert choice is not None
        dep = choice.deployment
        self.wire = self._wire(choice)
        self.upstream = PROTOCOLS[self.wire]
        upstream_model = dep.upstream_model or choice.model.name
        if self.translating and req.native_only:
            raise ClientError(f"{req.native_only}: only a deployment speaking this API can take them, and "
                              f"{choice.model.name} was routed to {dep.cluster}, which speaks {dep.protocol}")
        with ctx.span("translate request", self._translation_attributes() if ctx.trace is not None else None):
            if self.translating:
                auth = self.call.auth
                options = RenderOptions(legacy_max_tokens=dep.max_tokens_field == "max_tokens", cloud=auth.cloud)
                req = self._drop_params(req, options)
                req = self._clamped(req, choice.model.capabilities.max_output_tokens)
                up = self.upstream.render_request(req, upstream_model=upstream_model, credential=auth.credential,
                                                  options=options)
                path, up_headers, out = up.path, up.headers, up.body
            else:  # the client's own bytes: only the path and headers are new
                path, up_headers = self.upstream.request_target(req, upstream_model=upstream_model,
                                                                credential=self.call.auth.credential)
                # Redacted input: the same replacements in the body's strings, every other field kept.
                src = self.guarded_body if self.guarded_body is not None else body
                if (cap := self._clamp_to(req, choice.model.capabilities.max_output_tokens)) is not None:
                    src = with_output_cap(ctx.protocol, src, cap)
                out, self.usage_injected = self.upstream.passthrough_body(src, req, upstream_model=upstream_model)
        if ctx.trace is not None:
            self.response_model = upstream_model  # until the upstream reports its own
        ctx.response_headers += choice.response_headers()
        prompt = functools.partial(prompt_text, req) if dep.replica_metrics is not None else None
        return self.call.request(path, out, up_headers, replace_body=out is not body, prompt=prompt,
                                 adapter=upstream_model)

    def _wire(self, choice: Choice) -> str:
        """The protocol the upstream is spoken in: the deployment's (flows/completions.py may keep the caller's)."""
        return choice.deployment.protocol

    def _drop_params(self, req: ChatRequest, options: RenderOptions) -> ChatRequest:
        """`req` less the controls the deployment's protocol cannot express, where its drop_params
        allows; any other such control is refused (400) by `controls.decide`."""
        unsupported = self.upstream.unsupported_controls(req, options)
        if not unsupported:
            return req
        choice = self.call.choice
        assert choice is not None and self.wire is not None
        dep = choice.deployment
        dropped = controls.decide(unsupported, effective_drop_params(dep.drop_params, choice.model.drop_params),
                                  target=self.wire, client=self.ctx.protocol)
        if not self.ctx.deferred:  # a deferred request is counted when its replay runs
            for name in dropped:
                DROPPED_PARAMS.labels(choice.model.name, dep.cluster, name).inc()
        self.ctx.response_headers.append((DROPPED_PARAMS_HEADER, ",".join(dropped)))
        return controls.without(req, dropped)

    def _clamped(self, req: ChatRequest, limit: int) -> ChatRequest:
        cap = self._clamp_to(req, limit)
        return req if cap is None else dataclasses.replace(req, max_tokens=cap)

    def _clamp_to(self, req: ChatRequest, limit: int) -> int | None:
        """Under routing.output_limit clamp, the model's limit where the asked output cap is over it
        (and the reply says so); None otherwise (under filter the scheduler kept such models out)."""
        if req.max_tokens is None or req.max_tokens <= limit or self.gw.config.routing.output_limit != "clamp":
            return None
        self.ctx.response_headers.append((OUTPUT_CLAMPED_HEADER, f"{req.max_tokens}->{limit}"))
        return limit

    def _deployment_reasoning(self) -> str:
        choice = self.call.choice
        return choice.deployment.reasoning if choice is not None else "show"

    def _translation_attributes(self) -> dict[str, str | bool]:
        return {"modelyard.translation.from": self.ctx.protocol, "modelyard.translation.to": self.wire or "",
                "modelyard.translation.passthrough": not self.translating}

    # -- response --------------------------------------------------------------------------
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        self.status = status
        self.client_status = status
        self._note_failover(headers)
        set_h = self.ctx.task_headers()
        remove = list(ROUTE_ANSWER_HEADERS)
        ctype = headers.get("content-type", "")
        if status < 400 and any(t in ctype for t in _STREAM_TYPES):
            assert self.request is not None  # parsed before anything went upstream
            self.streaming = True
            if self.cache_step is not None:
                self.assembly = Assembly()
            guarded = self.guard is not None and self.guard.checks.guards_output
            if self.wire is not None and (self.translating or self.usage_injected or guarded):
                # Same protocol: the upstream's bytes, less only the usage chunk we asked for; under
                # output guardrails, decoded and encoded again so text can be held back and checked.
                keep = self._deployment_reasoning() == "show"
                if guarded:
                    assert self.guard is not None
                    self.stream_guard = StreamGuard(self.guard)
                self.translator = (translate_stream(self.wire, self.ctx.protocol, self.request, keep_reasoning=keep,
                                                    stage=self._guard_stage if guarded else None)
                                   if self.translating or guarded
                                   else InjectedUsageFilter(PROTOCOLS[self.wire].StreamDecoder()))
                if self.assembly is not None:  # the translator's events are its own: read the upstream's beside it
                    self.recorder = PROTOCOLS[self.wire].StreamDecoder()
                remove.append("content-length")
                set_h.append(("content-type", "text/event-stream"))
            else:
                self.decoder = self.upstream.StreamDecoder()
            return msg.response_headers(set_h, remove, stream_body=True)
        limit = self.gw.config.extproc.max_body_bytes
        if (nbytes := answer_limit.oversized(headers, limit)) is not None:
            return self._oversized(status, nbytes, limit, set_h, remove)
        if status >= 400:
            self.upstream_failed = status >= 500
            self.client_status = upstream_error_status(status)
            set_h.append((":status", str(self.client_status)))
        if status >= 400 or self.translating:
            remove.append("content-length")
            set_h.append(("content-type", "application/json"))
        return msg.response_headers(set_h, remove)

    def _oversized(self, status: int, nbytes: int, limit: int, set_h: list[tuple[str, str]],
                   remove: list[str]) -> msg.ProcessingResponse:
        """An answer past max_body_bytes: the caller's own protocol takes it as sent; one that would
        need translating (or rewriting, an error's) is a 502 naming the limit."""
        choice = self.call.choice
        assert choice is not None  # routed before anything went upstream
        model, cluster = choice.model.name, choice.deployment.cluster
        if status < 400 and not self.translating:
            answer_limit.count(model, cluster, "passthrough")
            self._finish()  # the body never reaches us: metered now, without the usage it carries
            return msg.response_headers(set_h, remove, skip_body=True)
        answer_limit.count(model, cluster, "refused")
        self.upstream_failed = status >= 500
        self.client_status = 502
        self._finish()
        return answer_limit.refusal(self.ctx, nbytes, limit, self.wire or "")

    def _note_failover(self, headers: dict[str, str]) -> None:
        """Envoy retried onto a peer deployment: report and meter the one that answered."""
        choice = self.call.choice
        if self.call.pick is not None:
            self.call.answered_by(headers.get(UPSTREAM_HOST_HEADER, ""), headers.get(UPSTREAM_ATTEMPTS_HEADER, "1"))
        if choice is None or headers.get(UPSTREAM_ATTEMPTS_HEADER, "1") in ("", "0", "1"):
            return
        self.gw.accountant.record_failure(choice.deployment.cluster, self.ctx.tenant_name)
        served_by = self.gw.catalog.served_by(headers.get(UPSTREAM_HOST_HEADER, ""))
        peer = next((d for d in choice.model.deployments if d.cluster == served_by), None)
        if peer is not None and peer is not choice.deployment:
            choice.deployment = peer
            self.ctx.response_headers = [h for h in self.ctx.response_headers if h[0] != CLUSTER_HEADER]
            self.ctx.response_headers.append((CLUSTER_HEADER, peer.cluster))

    def response_body(self, chunk: bytes,
                      end_of_stream: bool) -> msg.ProcessingResponse | Awaitable[msg.ProcessingResponse]:
        if self.streaming:
            if self.stream_guard is not None and self.stream_guard.remote:
                return self._remote_checked_chunk(chunk, end_of_stream)
            return self._stream_chunk(chunk, end_of_stream)
        if self.guard is not None and self.guard.checks.remote_outputs and self.status < 400:
            return self._remote_checked_body(chunk)
        if not inline(len(chunk)):
            return self._large_body(chunk)
        with self.ctx.span("translate response",
                           self._translation_attributes() if self.ctx.trace is not None else None):
            body = self._whole_body(chunk)
        return self._replaced(body)

    async def _remote_checked_body(self, chunk: bytes) -> msg.ProcessingResponse:
        """A whole answer under remote output checks (webhooks, moderation, classification): the
        answer's text as the model wrote it is asked about first; a block replaces the answer."""
        guard = self.guard
        assert guard is not None
        try:
            resp = await sized(functools.partial(self.upstream.parse_response, chunk), len(chunk))
        except ModelyardError:
            resp = None  # unreadable: _whole_body says so in the caller's protocol
        if resp is not None:
            try:
                await self.gw.guard_hooks.check_output(guard, answer_text(resp), self.ctx.requested_model or "",
                                                       self.ctx.tenant_name, self.ctx.task_id, self.gw.config)
            except GuardrailBlocked as e:
                self.usage = resp.usage
                self.client_status = e.status
                return self._replaced(render_error_body(self.ctx.protocol, e.status, e.message, e.type))
            finally:
                record(guard, self.ctx)
        return await self._large_body(chunk) if not inline(len(chunk)) else self._replaced(self._whole_body(chunk))

    async def _remote_checked_chunk(self, chunk: bytes, end: bool) -> msg.ProcessingResponse:
        """A stream under remote output checks: decoded, held back and checked as usual, then each
        released segment is asked about before it is encoded; a block ends the stream there."""
        translator, sg, guard = self.translator, self.stream_guard, self.guard
        assert isinstance(translator, StreamTranslator) and sg is not None and guard is not None
        if self.first_chunk_at is None and chunk:
            self.first_chunk_at = time.monotonic()
        events = translator.decode(chunk, end)
        if self.recorder is not None:
            self._record(self.recorder.feed(chunk) + (self.recorder.close() if end else []), end)
        out = self._guard_stage(events, end)
        if released_text(out):
            out = await self._remote_checked_events(out)
        body = translator.encode(out)
        if end:
            self.upstream_failed = translator.error is not None and not translator.untranslatable
            self.usage = translator.meter.reported
            if sg.blocked is not None:
                self._blocked_usage(sg)
            self._finish()
        return msg.response_body(body=body)

    async def _remote_checked_events(self, out: list[StreamEvent]) -> list[StreamEvent]:
        """Released events, asked about a window at a time (all at once); the first block in order ends
        the stream after the pieces before it."""
        sg, guard, ctx = self.stream_guard, self.guard, self.ctx
        assert sg is not None and guard is not None
        groups = segments(out, sg.window)
        texts = [released_text(g) for g in groups]
        at = sg.released_chars - sum(len(t) for t in texts)
        offsets = [max(0, at + sum(len(t) for t in texts[:i])) for i in range(len(texts))]
        results = await asyncio.gather(*(
            self.gw.guard_hooks.check_output(guard, t, ctx.requested_model or "", ctx.tenant_name, ctx.task_id,
                                             self.gw.config, offset=o) for t, o in zip(texts, offsets, strict=True)),
            return_exceptions=True)
        record(guard, ctx)
        for i, r in enumerate(results):
            if isinstance(r, GuardrailBlocked):
                kept = [e for g in groups[:i] for e in g]
                return kept + sg.refuse(groups[i], r, sum(len(t) for t in texts[i:]))
            if isinstance(r, BaseException):
                raise r
        return out

    async def _large_body(self, chunk: bytes) -> msg.ProcessingResponse:
        """A large answer is decoded, translated and encoded in a worker thread (offload.py)."""
        with self.ctx.span("translate response",
                           self._translation_attributes() if self.ctx.trace is not None else None):
            body = await asyncio.to_thread(self._whole_body, chunk)
        return self._replaced(body)

    def _replaced(self, body: bytes | None) -> msg.ProcessingResponse:
        if self.cache_step is not None and self.answer is not None and self.client_status == self.status < 300:
            assert self.gw.response_cache is not None
            self.gw.response_cache.keep(self.cache_step, self.answer)
        self._finish()
        return msg.replaced_body(body, self.client_status if self.client_status != self.status else None)

    def _whole_body(self, body: bytes) -> bytes | None:
        choice = self.call.choice
        model = choice.model.name if choice else ""
        if self.status >= 400:
            # The caller gets the status and a provider message at most; the log keeps the body.
            log.info("task %s: upstream %s answered %d: %s", self.ctx.task_id,
                     choice.deployment.cluster if choice else "-", self.status, log_excerpt(body))
            return self.client.render_error(self.client_status,
                                            upstream_errors.client_text(self.status, body, self.ctx.task_id))
        try:
            resp = self.upstream.parse_response(body)
        except ModelyardError as e:
            self.client_status = 502
            self.upstream_failed = True
            return render_error_body(self.ctx.protocol, 502, f"upstream sent an unreadable reply: {e.message}",
                                     "api_error")
        self.usage = resp.usage
        if resp.model:
            self.response_model = resp.model
        guarded = self._guarded_answer(resp)
        if isinstance(guarded, bytes):
            return guarded
        if not self.translating:
            self.answer = guarded
            if guarded is resp:
                return None
            assert self.guard is not None
            return rewrite_json(body, self.guard.answer_rewrites())
        resp = guarded
        if resp.untranslatable is not None:
            # Valid, but not in the caller's protocol: a clear error, never an answer with parts missing.
            self.client_status = 502
            return render_error_body(self.ctx.protocol, 502, resp.untranslatable, "api_error")
        if self._deployment_reasoning() == "drop":
            resp = without_reasoning(resp)
        self.answer = resp
        out = self.client.render_response(resp, model=model, request=self.request)
        limit = self.gw.config.extproc.max_body_bytes
        if len(out) > limit:  # a translation may outgrow its source: past the limit, nothing sends it on
            assert choice is not None
            answer_limit.count(model, choice.deployment.cluster, "refused")
            self.client_status = 502
            return render_error_body(self.ctx.protocol, 502, answer_limit.refusal_text(
                len(out), limit, self.wire or "", self.ctx.protocol, translated=True), "api_error")
        return out

    def _stream_chunk(self, chunk: bytes, end: bool) -> msg.ProcessingResponse:
        if self.first_chunk_at is None and chunk:
            self.first_chunk_at = time.monotonic()
        if self.translator is not None:
            out = self.translator.feed(chunk)
            if self.recorder is not None:
                self._record(self.recorder.feed(chunk) + (self.recorder.close() if end else []), end)
            if end:
                out += self.translator.finish()
                # An answer the client's protocol cannot express is no failure of the upstream's.
                self.upstream_failed = self.translator.error is not None and not (
                    isinstance(self.translator, StreamTranslator) and self.translator.untranslatable)
                self.usage = self.translator.meter.reported
                if self.stream_guard is not None and self.stream_guard.blocked is not None:
                    self._blocked_usage(self.stream_guard)
                self._finish()
            return msg.response_body(body=out)
        tail = b""
        decoder, request = self.decoder, self.request
        assert decoder is not None and request is not None  # set when the stream's headers came
        try:
            events = decoder.feed(chunk) + (decoder.close() if end else [])
            self.meter.observe(events)
            if self.assembly is not None:
                self._record(events, end)
            if self.ctx.trace is not None and events and type(events[0]) is StreamStart:
                self.response_model = events[0].model or self.response_model
            for ev in events:
                if type(ev) is StreamError and end:
                    # The upstream stopped mid-stream: end the client's stream with an error event
                    # (not a StreamUntranslatable: a same-protocol client reads that answer as sent).
                    tail = self.client.StreamEncoder(model=request.model, request=request).encode([ev])
                    self.client_status = 502
                    self.upstream_failed = True
        except ModelyardError:
            pass  # passthrough stream: the client parses it; metering just misses usage
        if end:
            self.usage = self.meter.reported
            self._finish()
        return msg.response_body(body=chunk + tail) if tail else msg.response_body()

    def _guard_stage(self, events: list[StreamEvent], end: bool) -> list[StreamEvent]:
        guard = self.stream_guard
        assert guard is not None and self.guard is not None
        out = guard.feed(events, end)
        if self.guard.verdicts:
            record(self.guard, self.ctx)
        return out

    def _blocked_usage(self, guard: StreamGuard) -> None:
        """A stream a guardrail ended: metered for the text the caller got, not what the upstream made."""
        choice = self.call.choice
        reported = self.usage or Usage()
        est_in = choice.est_prompt_tokens if choice is not None else 0
        self.usage = Usage(input_tokens=reported.input_tokens or est_in, output_tokens=-(-guard.released_chars // 4),
                           cache=reported.cache, web_searches=reported.web_searches)  # the searches ran, billed
        self.client_status = 400
        self.answer = None

    def _record(self, events: list[StreamEvent], end: bool) -> None:
        """A stream on its way to the cache: kept when it ended whole (never a cut or failed one)."""
        assembly, step = self.assembly, self.cache_step
        assert assembly is not None and step is not None and self.gw.response_cache is not None
        assembly.feed(events)
        if not end:
            return
        self.assembly = None
        resp = assembly.response()
        if resp is not None and self.client_status < 300:
            self.gw.response_cache.keep(step, without_reasoning(resp) if self._deployment_reasoning() == "drop"
                                        else resp)

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        self._finish()
        return msg.response_trailers()

    # -- accounting ------------------------------------------------------------------------
    def _finish(self, *, upstream_answered: bool = True) -> None:
        if not self.call.pending:
            return
        trace = self.ctx.trace
        if trace is not None and self.call.metered and self.streaming and self.first_chunk_at is not None:
            trace.record_since("translate response", self.first_chunk_at, self._translation_attributes())
        ttft = (self.first_chunk_at - self.ctx.started) if self.first_chunk_at else None
        self.call.finish(self.client_status or self.status,
                         upstream_ok=(not self.upstream_failed) if upstream_answered and self.status else None,
                         usage=self.usage, ttft_s=ttft, response_model=self.response_model)

    def defer(self) -> None:
        self.call.release()

    def close(self) -> None:
        choice = self.call.choice
        if self.call.pending and choice is not None:
            meter = self.translator.meter if self.translator is not None else self.meter
            if self.stream_guard is not None and self.stream_guard.blocked is not None:
                # A guardrail ended the stream and the caller, having read the error event, hung up
                # before its end reached us: the block's status, metered for the text sent.
                self.usage = meter.reported if meter.ended else meter.partial(choice.est_prompt_tokens)
                self._blocked_usage(self.stream_guard)
                self._finish()
                return
            if self.streaming and meter.ended:
                # The whole answer went by (the upstream's end marker) and the client, having read it,
                # hung up before Envoy's empty end-of-stream message reached us: a complete call.
                self.usage = meter.reported
                self._finish()
                return
            # The stream ended without a final body: the client went away (499, as nginx logs it), the
            # gateway failed the request, or the upstream reset mid-stream; none of it is held against
            # the deployment: an upstream that is really down fails the next connects, which count.
            self.client_status = 499
            if self.streaming:  # charge and meter what already streamed, not the whole estimate back
                self.usage = meter.partial(choice.est_prompt_tokens)
            self._finish(upstream_answered=False)
