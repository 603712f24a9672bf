"""The process-wide state every session shares: config, keys, scheduler, limiter, batcher.

`Gateway.classify` maps a request's method and path to what handles it: an answer straight from
config (model lists, health) or a flow that sends the request upstream.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from extproc import extproc_messages as msg
from extproc.auth import KeyRing
from extproc.choice import Choice
from extproc.config import Deployment, GatewayConfig, ModelConfig
from extproc.errors import GatewayError
from extproc.failover import aggregate_name, failover_groups, parse_xlate
from extproc.headers import CHANNEL_HEADER, STRATEGY_HEADER
from extproc.metering import MeteringStore, MeterRecord
from extproc.metrics import CHANNEL, COST, model_series, requests_series
from extproc.routing import NoRoute, RouteRequest, Scheduler
from extproc.session import Flow, RequestContext, json_response
from ratelimit import RequestContext as RateLimitContext

log = logging.getLogger("modelyard.gateway")

Answer = Callable[["Gateway", RequestContext], msg.ProcessingResponse]
FlowFactory = Callable[["Gateway", RequestContext], Flow]

_MODEL_PATH = re.compile(r"^/v1/models/(?P<model>[^/]+)$")
_V2_MODEL = re.compile(r"^/v2/models/(?P<model>[^/]+)(?:/versions/[^/]+)?(?P<infer>/infer)?$")


@dataclass(frozen=True, slots=True)
class RouteSpec:
    protocol: str
    path_model: str | None = None
    stream: bool = False
    public: bool = False
    answer: Answer | None = None
    make_flow: FlowFactory | None = None


class Gateway:
    def __init__(self, config: GatewayConfig, *, scheduler: Scheduler | None = None, limiter: Any = None,
                 batcher: Any = None, watermarks: Any = None, image_backend: Any = None,
                 metering: MeteringStore | None = None):
        self.config = config
        self.keyring = KeyRing(config.tenants)
        self.models: dict[str, ModelConfig] = {m.name: m for m in config.models}
        self.scheduler = scheduler or Scheduler(config)
        self.limiter = limiter
        self.batcher = batcher
        self.image_backend = image_backend  # kernels.Backend: CuPy on a GPU, else NumPy
        self.metering = metering
        self.watermarks = watermarks
        # Deployments with same-protocol peers are sent to their Envoy failover cluster.
        groups = failover_groups(config)
        self.envoy_cluster = {c: aggregate_name(c) for c in groups}
        # Endpoint -> cluster for failover members: tells who answered after an Envoy retry.
        clusters = config.clusters()
        self.endpoint_cluster = {ep: c for members in groups.values() for c in members if c in clusters
                                 for ep in clusters[c].endpoints}
        self._background: set[asyncio.Task] = set()

    # -- what handles a request -------------------------------------------------------------
    def classify(self, ctx: RequestContext) -> RouteSpec:
        from adapters.registry import detect_client_protocol

        method, path = ctx.method, ctx.path
        if method == "GET":
            if path == "/v1/models":
                return RouteSpec("openai", answer=_list_models)
            if m := _MODEL_PATH.match(path):
                return RouteSpec("openai", path_model=m["model"], answer=_get_model)
            if path in ("/v2/health/ready", "/v2/health/live", "/v2"):
                return RouteSpec("kserve", public=True, answer=_v2_health)
            if (m := _V2_MODEL.match(path)) and not m["infer"]:
                return RouteSpec("kserve", path_model=m["model"], answer=_v2_model_metadata)
        if method == "POST":
            if (m := _V2_MODEL.match(path)) and m["infer"]:
                from extproc.vision_flow import KServeInferFlow

                return RouteSpec("kserve", path_model=m["model"], make_flow=KServeInferFlow)
            if path == "/v1/images/classify":
                from extproc.vision_flow import ClassifyFlow

                return RouteSpec("openai", make_flow=ClassifyFlow)
            client = detect_client_protocol(method, path)
            if client is not None:
                from extproc.chat_flow import ChatFlow

                return RouteSpec(client.protocol, path_model=client.model, stream=client.stream,
                                 make_flow=ChatFlow)
        return RouteSpec("openai", public=True, answer=_not_found)

    def client_key(self, ctx: RequestContext) -> str | None:
        from adapters.registry import PROTOCOLS

        adapter = PROTOCOLS.get(ctx.protocol)
        if adapter is not None:
            return adapter.client_api_key(ctx.headers, ctx.query)
        auth = ctx.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return ctx.headers.get("x-api-key")

    def visible_models(self, ctx: RequestContext) -> list[ModelConfig]:
        assert ctx.tenant is not None
        return [m for m in self.config.models if ctx.tenant.may_use(m.name)]

    def model_for(self, ctx: RequestContext, name: str) -> ModelConfig:
        """A model the tenant may use; unknown and forbidden look the same so keys can't probe."""
        model = self.models.get(name)
        if model is None or ctx.tenant is None or not ctx.tenant.may_use(name):
            raise GatewayError(404, f"The model `{name}` does not exist or you do not have access to it.",
                               "not_found_error")
        return model

    # -- routing, admission and accounting ---------------------------------------------------
    async def choose_chat(self, ctx: RequestContext, req: Any) -> Choice:
        from adapters.internal import ImagePart, estimate_prompt_tokens

        prompt_tokens = estimate_prompt_tokens(req)
        choice = self.choose(ctx, RouteRequest(
            model=req.model, tenant=ctx.tenant, strategy_override=ctx.headers.get(STRATEGY_HEADER),
            want_fast=ctx.headers.get(CHANNEL_HEADER, "").lower() == "fast",
            est_prompt_tokens=prompt_tokens, est_output_tokens=req.max_tokens,
            needs_tools=bool(req.tools),
            needs_vision=any(type(p) is ImagePart for m in req.messages for p in m.content),
            stream=req.stream, task_type="chat", task_id=ctx.task_id))
        await self.admit(ctx, choice, prompt_tokens + (req.max_tokens or 256))
        return choice

    def choose(self, ctx: RequestContext, route: RouteRequest) -> Choice:
        """The scheduler's pick (filter, score, admission) as a Choice."""
        try:
            d = self.scheduler.decide(route, time.monotonic(), self.watermarks.readings if self.watermarks else {})
        except NoRoute as e:
            raise GatewayError(e.status, e.message, e.type, e.headers) from None
        c = d.chosen
        return Choice(model=c.model_config, deployment=c.deployment, channel=c.channel, strategy=d.strategy,
                      arm=d.arm)

    async def admit(self, ctx: RequestContext, choice: Choice, est_tokens: int) -> None:
        """Charge the tenant's, tier's, cluster's, channel's and global buckets, all or none."""
        if self.limiter is None or ctx.tenant is None or self.limiter.config.enforce != "extproc":
            return
        decision = await self.limiter.acquire(
            RateLimitContext(ctx.tenant.name, ctx.tenant.tier, choice.deployment.cluster, choice.channel),
            est_tokens)
        if not decision.allowed:
            if decision.too_large:
                raise GatewayError(429, f"request needs about {est_tokens} tokens, more than the limit allows "
                                        f"({decision.limited_by})", "rate_limit_error", decision.headers())
            raise GatewayError(429, f"rate limit exceeded ({decision.limited_by}); retry in "
                                    f"{decision.retry_after_s:.1f}s", "rate_limit_error", decision.headers())
        choice.reservation = decision.reservation
        choice.ratelimit_headers = decision.headers()

    def record_outcome(self, ctx: RequestContext, choice: Choice, *, status: int, latency_s: float,
                       ttft_s: float | None, usage: Any, reservation: Any) -> None:
        model = choice.model
        # Feedback for the score and cooldowns: only the upstream's failures count against it.
        self.scheduler.record(choice.deployment.cluster, latency_s, status < 500, ttft_s, now=time.monotonic())
        latency, ttft, tokens_in, tokens_out = model_series(model.name, choice.deployment.cluster)
        requests_series(model.name, choice.deployment.cluster, status).inc()
        latency.observe(latency_s)
        CHANNEL.labels(choice.channel, ctx.tenant.tier if ctx.tenant else "-").inc()
        if ttft_s is not None:
            ttft.observe(ttft_s)
        if usage is not None:
            tin, tout = usage.input_tokens or 0, usage.output_tokens or 0
            tokens_in.inc(tin)
            tokens_out.inc(tout)
        else:
            tin = tout = 0
        cost = tin / 1000 * model.cost.input_per_1k + tout / 1000 * model.cost.output_per_1k
        tenant = ctx.tenant.name if ctx.tenant else "-"
        if cost:
            COST.labels(model.name, tenant).inc(cost)
        if self.metering is not None:
            self.metering.record(MeterRecord(
                time.time(), ctx.task_id, tenant, ctx.tenant.tier if ctx.tenant else "-", model.name,
                choice.deployment.cluster, choice.channel, status, latency_s * 1000,
                ttft_s * 1000 if ttft_s is not None else None, tin, tout, cost, choice.strategy, choice.arm))
        if reservation is not None and self.limiter is not None:
            # Hand back (or take) the difference between the estimate and the reported usage.
            actual = (usage.input_tokens + usage.output_tokens) if usage is not None else 0
            task = asyncio.get_running_loop().create_task(self.limiter.reconcile(reservation, actual))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def deployment(self, cluster: str) -> tuple[ModelConfig, Deployment]:
        """The model and deployment a cluster belongs to (the first model, if several share it)."""
        for m in self.config.models:
            for d in m.deployments:
                if d.cluster == cluster:
                    return m, d
        raise GatewayError(502, f"no deployment for cluster {cluster!r}", "api_error")

    def served_by(self, upstream_host: str) -> str | None:
        """The cluster behind Envoy's %UPSTREAM_HOST%: an endpoint, or a translation hop's
        internal listener (`envoy://xlate~<protocol>~<cluster>/...`)."""
        if upstream_host.startswith("envoy://"):
            hop = parse_xlate(upstream_host[len("envoy://"):].split("/", 1)[0])
            return hop[1] if hop else None
        return self.endpoint_cluster.get(upstream_host)

    def record_failure(self, cluster: str) -> None:
        """A deployment failed before answering (Envoy failed over to a peer)."""
        self.scheduler.record(cluster, 0.0, False, now=time.monotonic())

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.metering is not None:
            await asyncio.to_thread(self.metering.close)
        for part in (self.watermarks, self.limiter, self.batcher):
            close = getattr(part, "close", None)
            if close is not None:
                await close()


def _model_card(m: ModelConfig) -> dict[str, Any]:
    return {"id": m.name, "object": "model", "created": 0, "owned_by": m.owned_by,
            "task_types": list(m.task_types)}


def _list_models(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, {"object": "list", "data": [_model_card(m) for m in gw.visible_models(ctx)]}, ctx)


def _get_model(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, _model_card(gw.model_for(ctx, ctx.path_model or "")), ctx)


def _v2_health(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return json_response(200, {"ready": True, "live": True}, ctx)


def _v2_model_metadata(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    from adapters import kserve

    model = gw.model_for(ctx, ctx.path_model or "")
    return msg.immediate(200, kserve.render_model_metadata(model),
                         [("content-type", "application/json"), *ctx.task_headers()])


def _not_found(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    raise GatewayError(404, f"Unknown request URL: {ctx.method} {ctx.path}", "not_found_error")
