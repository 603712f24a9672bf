"""Images and audio: `/v1/images/generations|edits`, `/v1/audio/transcriptions|translations|speech`
passed through to OpenAI-shaped deployments (docs/media.md), routed, admitted and metered in the
units each bills: images, seconds of audio, characters of speech.

The caller's body goes upstream as sent (only `model` renamed where the deployment names it
otherwise). Speech audio, and any streamed answer, goes back to the caller as the upstream sends it
(the body is never buffered here); an error answer is rewritten in OpenAI's error shape.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

from adapters import image_translation, media, upstream_errors
from adapters.image_generation import ImageAsk
from adapters.media import Endpoint, MediaRequest
from adapters.multipart import MultipartLimits
from adapters.upstream_errors import log_excerpt
from contracts.envoy_names import CHANNEL_HEADER, STRATEGY_HEADER
from contracts.errors import ClientError, UpstreamError, default_type
from extproc import messages as msg
from extproc.context import RequestContext
from extproc.errors import render_error_body
from extproc.flows.offload import sized
from extproc.flows.upstream import ROUTE_ANSWER_HEADERS, UpstreamCall, upstream_error_status
from extproc.gateway import Gateway
from extproc.routing import RouteRequest

log = logging.getLogger("modelyard.media")

# The deployment protocols that speak OpenAI's images and audio API as it is.
PASSTHROUGH = frozenset({"openai"})


class MediaFlow:
    def __init__(self, gw: Gateway, ctx: RequestContext, endpoint: Endpoint) -> None:
        self.gw = gw
        self.ctx = ctx
        self.endpoint = endpoint
        self.request: MediaRequest | None = None
        self.call = UpstreamCall(gw, ctx, counts_output=False)
        self.status = 0
        self.client_status = 0
        self.upstream_failed = False
        self.translated: tuple[image_translation.Kind, ImageAsk] | None = None  # (provider API, what was asked)

    # -- request ---------------------------------------------------------------------------
    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        ctx, gw = self.ctx, self.gw
        assert ctx.tenant is not None
        content_type = ctx.headers.get("content-type")
        limits = MultipartLimits(max_body_bytes=gw.config.extproc.max_body_bytes, max_parts=64)
        req = await sized(functools.partial(media.parse_request, self.endpoint, body, content_type, limits), len(body))
        if not req.model:
            req = dataclasses.replace(req, model=self._callers_only_model())
        self.request = req
        choice = gw.dispatcher.choose_for(ctx, RouteRequest(
            model=req.model, tenant=ctx.tenant, strategy_override=ctx.headers.get(STRATEGY_HEADER),
            want_fast=ctx.headers.get(CHANNEL_HEADER, "").lower() == "fast", est_output_tokens=0,
            task_type=self.endpoint.task_type, task_id=ctx.task_id))
        dep = choice.deployment
        translate = self.endpoint.kind == "images.generations" and dep.protocol in image_translation.TRANSLATED
        if dep.protocol not in PASSTHROUGH and not translate:
            raise ClientError(f"model `{req.model}` is served over {dep.protocol}; {self.endpoint.path} passes "
                              "through to OpenAI-shaped deployments only")
        await gw.dispatcher.admit(ctx, choice, 0)
        self.call.choice = choice
        await gw.dispatcher.wait_for_slot(ctx, choice)
        auth = await self.call.authorize()
        upstream_model = dep.upstream_model or choice.model.name
        ctx.response_headers += choice.response_headers()
        if translate:  # Imagen/Gemini on Vertex or the Gemini API, Titan Image on Bedrock: rendered for the provider
            assert req.json is not None
            up, ask, kind = image_translation.render_request(dep.protocol, req.json, upstream_model=upstream_model,
                                                             credential=auth.credential, cloud=auth.cloud)
            self.translated = (kind, ask)
            return self.call.request(up.path, up.body, up.headers, cluster=dep.cluster)
        headers = {"content-type": content_type or "application/json"}
        if auth.credential:
            headers["authorization"] = "Bearer " + auth.credential
        renamed = await sized(functools.partial(media.render_body, req, body, content_type, upstream_model),
                              len(body))
        return self.call.request(self.endpoint.path, renamed if renamed is not None else body, headers,
                                 cluster=dep.cluster, replace_body=renamed is not None)

    def _callers_only_model(self) -> str:
        """A moderation call without a model (OpenAI's default one): the caller's only model of the
        endpoint's task type stands in; with none or several, the caller must name one."""
        assert self.ctx.tenant is not None
        task = self.endpoint.task_type
        names = [m.name for m in self.gw.catalog.visible(self.ctx.tenant) if task in m.task_types]
        if len(names) == 1:
            return names[0]
        if not names:
            raise ClientError(f"model is required: this key has no {task} model to stand in for OpenAI's default")
        raise ClientError(f"model is required: this key has several {task} models ({', '.join(names[:8])})")

    # -- response --------------------------------------------------------------------------
    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        self.status = self.client_status = status
        req = self.request
        assert req is not None  # parsed before anything went upstream
        set_h = self.ctx.task_headers()
        remove = list(ROUTE_ANSWER_HEADERS)
        if status >= 400:
            self.upstream_failed = status >= 500
            self.client_status = upstream_error_status(status)
            set_h += [(":status", str(self.client_status)), ("content-type", "application/json")]
            remove.append("content-length")
            return msg.response_headers(set_h, remove)
        if req.endpoint.kind == "audio.speech" or req.stream or "text/event-stream" in headers.get("content-type", ""):
            # Audio (and any stream) goes to the caller as it comes; its units are known already.
            self._finish(req.est_units if req.endpoint.unit == "character" else req.audio_seconds or req.est_units)
            return msg.response_headers(set_h, remove, skip_body=True)
        if self.translated is not None:  # the body is replaced by OpenAI's shape
            set_h.append(("content-type", "application/json"))
            remove.append("content-length")
        return msg.response_headers(set_h, remove)

    def response_body(self, chunk: bytes, end_of_stream: bool) -> msg.ProcessingResponse:
        req, choice = self.request, self.call.choice
        assert req is not None and choice is not None
        if self.status >= 400:
            log.info("task %s: upstream %s answered %d: %s", self.ctx.task_id, choice.deployment.cluster,
                     self.status, log_excerpt(chunk))
            self._finish(0.0)
            body = render_error_body(self.ctx.protocol, self.client_status,
                                     upstream_errors.client_text(self.status, chunk, self.ctx.task_id),
                                     default_type(self.client_status))
            return msg.replaced_body(body, self.client_status if self.client_status != self.status else None)
        if self.translated is not None:
            kind, ask = self.translated
            try:
                answer = image_translation.render_answer(kind, chunk, ask, int(time.time()))
            except UpstreamError as e:
                self.upstream_failed, self.client_status = True, 502
                log.warning("task %s: %s", self.ctx.task_id, e.message)
                self._finish(0.0)
                return msg.replaced_body(render_error_body(self.ctx.protocol, 502, e.message, default_type(502)), 502)
            self._finish(media.answer_units(req, answer))
            return msg.replaced_body(answer)
        self._finish(media.answer_units(req, chunk))
        return msg.replaced_body(None)

    def response_trailers(self, trailers: dict[str, str]) -> msg.ProcessingResponse:
        return msg.response_trailers()

    # -- accounting ------------------------------------------------------------------------
    def _finish(self, units: float, *, upstream_answered: bool = True) -> None:
        self.call.finish(self.client_status or self.status, media=(self.endpoint.unit, units),
                         upstream_ok=(not self.upstream_failed) if upstream_answered and self.status else None)

    def defer(self) -> None:
        self.call.release()

    def close(self) -> None:
        if self.call.pending:
            self.client_status = 499  # the client went away or the gateway failed the request
            self._finish(0.0, upstream_answered=False)
