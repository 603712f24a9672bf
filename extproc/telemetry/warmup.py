"""Warm-up: a deployment that declares `warmup:` gets a request before real traffic reaches it, at
start, on SIGHUP, when it comes back from a cooldown, and (with a `health_check:`) when it comes
back from being unhealthy; until every endpoint has answered it is `warming` and the scheduler
routes elsewhere (or to it anyway when every candidate is warming).

`warmup_call` is pure (the request to send, in the deployment's own protocol); `Warmer` sends it
to each endpoint in the background, straight to the endpoint (each instance warms its own cache).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from adapters import kserve
from adapters.internal import ChatRequest, Message, TextPart
from adapters.registry import PROTOCOLS
from contracts.config import Deployment, GatewayConfig
from extproc.routing import Scheduler
from extproc.telemetry.metrics import WARMING, WARMUPS

log = logging.getLogger(__name__)

_COOLDOWN_WATCH_S = 0.25


@dataclass(frozen=True, slots=True)
class WarmupCall:
    """One request to each endpoint: HTTP (method, path, headers, body), or gRPC ModelReady."""

    kind: str  # "http" | "grpc-ready"
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    model: str


RESPONSES_MIN_OUTPUT_TOKENS = 16


def warmup_call(dep: Deployment, model: str) -> WarmupCall:
    """The deployment's warm-up request: a short completion for chat protocols, model readiness
    for KServe (REST GET .../ready, gRPC ModelReady)."""
    assert dep.warmup is not None
    upstream_model = dep.upstream_model or model
    if dep.protocol == "kserve-grpc":
        return WarmupCall("grpc-ready", "", "", {}, b"", upstream_model)
    if dep.protocol == "kserve-rest":
        path = kserve.rest_infer_path(upstream_model).removesuffix("/infer") + "/ready"
        return WarmupCall("http", "GET", path, {}, b"", upstream_model)
    # OpenAI's Responses API refuses max_output_tokens below 16 (a 400 would leave it warming).
    floor = RESPONSES_MIN_OUTPUT_TOKENS if dep.protocol == "responses" else 1
    req = ChatRequest(model=model, messages=(Message("user", (TextPart(dep.warmup.prompt),)),),
                      max_tokens=max(dep.warmup.max_tokens, floor))
    up = PROTOCOLS[dep.protocol].render_request(req, upstream_model=upstream_model, credential=dep.credential())
    return WarmupCall("http", "POST", up.path, {**up.headers, "content-type": "application/json"}, up.body,
                      upstream_model)


def ssl_context(dep: Deployment) -> ssl.SSLContext | bool:
    if not dep.tls:
        return False
    if dep.tls_insecure_skip_verify:
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        return ctx
    ctx = ssl.create_default_context(cafile=dep.tls_ca_file)
    if dep.tls_client_cert_file and dep.tls_client_key_file:
        ctx.load_cert_chain(dep.tls_client_cert_file, dep.tls_client_key_file)
    return ctx


class Warmer:
    """Runs warm-ups in the background and keeps `scheduler.warming` up to date."""

    def __init__(self, config: GatewayConfig, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._deployments = {name: dep for name, dep in config.clusters().items() if dep.warmup is not None}
        self._models = {d.cluster: m.name for m in config.models for d in m.deployments}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._watch: asyncio.Task[None] | None = None
        self._health_by: dict[str, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._started = False

    @property
    def clusters(self) -> tuple[str, ...]:
        return tuple(self._deployments)

    def start(self) -> None:
        """Warm every deployment that declares it, and watch cooldowns from now on."""
        self._started = True
        if not self._deployments:
            return
        self._session = aiohttp.ClientSession()
        self.warm_all()
        self._watch = asyncio.create_task(self._watch_cooldowns())
        self._health_by = {c: asyncio.create_task(self._watch_health(c)) for c, d in self._deployments.items()
                           if d.health_check is not None}

    def reconfigure(self, config: GatewayConfig, scheduler: Scheduler) -> None:
        """A reload: the new deployments' warm-ups and health checks; a removed or changed deployment's
        warm-up and health watch stop (a changed one starts again). Call `warm_all` after, as SIGHUP does."""
        fresh = {name: dep for name, dep in config.clusters().items() if dep.warmup is not None}
        self.scheduler = scheduler
        self._models = {d.cluster: m.name for m in config.models for d in m.deployments}
        changed = [c for c, d in self._deployments.items() if fresh.get(c) != d]
        for cluster in changed:
            task = self._tasks.pop(cluster, None)
            if task is not None:
                task.cancel()  # its `finally` takes it out of `warming`
            watch = self._health_by.pop(cluster, None)
            if watch is not None:
                watch.cancel()
                scheduler.warming.discard(cluster)  # a health watch may have left it marked
                WARMING.labels(cluster).set(0)
        self._deployments = fresh
        if not fresh or self._session is None and not self._started:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if self._watch is None:
            self._watch = asyncio.create_task(self._watch_cooldowns())
        for c, d in fresh.items():
            if d.health_check is not None and c not in self._health_by:
                self._health_by[c] = asyncio.create_task(self._watch_health(c))

    def warm_all(self) -> None:
        for cluster in self._deployments:
            self.warm(cluster)

    def warm(self, cluster: str, *, after: float = 0.0) -> None:
        """Mark `cluster` warming now and send its warm-up after `after` seconds (a cooldown's end)."""
        if cluster not in self._deployments or (cluster in self._tasks and not self._tasks[cluster].done()):
            return
        self.scheduler.warming.add(cluster)
        WARMING.labels(cluster).set(1)
        self._tasks[cluster] = asyncio.create_task(self._run(cluster, after))

    async def close(self) -> None:
        tasks = [t for t in (self._watch, *self._health_by.values(), *self._tasks.values()) if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _run(self, cluster: str, after: float) -> None:
        dep = self._deployments[cluster]
        assert dep.warmup is not None
        outcome = "timeout"
        try:
            if after > 0:
                await asyncio.sleep(after)
            call = warmup_call(dep, self._models[cluster])
            deadline = time.monotonic() + dep.warmup.timeout_s
            pending = list(dep.endpoints)
            started = time.monotonic()
            while pending and time.monotonic() < deadline:
                results = await asyncio.gather(*(self._send(dep, call, ep, deadline) for ep in pending))
                pending = [ep for ep, ok in zip(pending, results, strict=True) if not ok]
                if pending:
                    await asyncio.sleep(min(dep.warmup.retry_interval_s, max(0.0, deadline - time.monotonic())))
            if not pending:
                outcome = "ok"
                log.info("deployment %s warmed up in %.2fs", cluster, time.monotonic() - started)
            else:
                log.warning("deployment %s: warm-up of %s unanswered after %.0fs; routing to it anyway",
                            cluster, ", ".join(pending), dep.warmup.timeout_s)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            self.scheduler.warming.discard(cluster)
            WARMING.labels(cluster).set(0)
            WARMUPS.labels(cluster, outcome).inc()

    async def _send(self, dep: Deployment, call: WarmupCall, endpoint: str, deadline: float) -> bool:
        assert self._session is not None
        return await send_warmup(self._session, dep, call, endpoint, max(0.1, deadline - time.monotonic()))

    async def _watch_health(self, cluster: str) -> None:
        """The deployment's own health check, read as Envoy reads it: when every endpoint has failed
        `unhealthy_threshold` checks in a row it is out (kept warming, so routing goes elsewhere as
        Envoy's would); when one passes `healthy_threshold` again, it is warmed before traffic."""
        dep = self._deployments[cluster]
        hc = dep.health_check
        assert hc is not None
        fails = dict.fromkeys(dep.endpoints, 0)
        passes = dict.fromkeys(dep.endpoints, 0)
        down = False
        while True:
            await asyncio.sleep(hc.interval_s)
            results = await asyncio.gather(*(self._probe(dep, ep) for ep in dep.endpoints))
            for ep, ok in zip(dep.endpoints, results, strict=True):
                fails[ep], passes[ep] = (0, passes[ep] + 1) if ok else (fails[ep] + 1, 0)
            if not down and all(n >= hc.unhealthy_threshold for n in fails.values()):
                down = True
                log.warning("deployment %s: every endpoint fails its health check; warming it up once it passes",
                            cluster)
                self.scheduler.warming.add(cluster)
                WARMING.labels(cluster).set(1)
            elif down and any(n >= hc.healthy_threshold for n in passes.values()):
                down = False
                self.scheduler.warming.discard(cluster)  # warm() marks it again while its request runs
                self.warm(cluster)

    async def _probe(self, dep: Deployment, endpoint: str) -> bool:
        assert self._session is not None
        return await endpoint_healthy(self._session, dep, endpoint)

    async def _watch_cooldowns(self) -> None:
        """A deployment that starts a cooldown is marked warming at once, and warmed when it ends."""
        while True:
            await asyncio.sleep(_COOLDOWN_WATCH_S)
            now = time.monotonic()
            for cluster in self._deployments:
                until = self.scheduler.feedback.cooling_until(cluster, now)
                if until is not None:
                    self.warm(cluster, after=until - now)


async def send_warmup(session: aiohttp.ClientSession, dep: Deployment, call: WarmupCall, endpoint: str,
                      timeout: float) -> bool:
    """The warm-up call at one endpoint: answered (2xx, or the KServe model ready)."""
    try:
        if call.kind == "grpc-ready":
            return await _grpc_ready(dep, endpoint, call.model, timeout)
        scheme = "https" if dep.tls else "http"
        async with session.request(call.method, f"{scheme}://{endpoint}{call.path}", data=call.body or None,
                                   headers=call.headers, ssl=ssl_context(dep),
                                   timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            await resp.read()
            return 200 <= resp.status < 300
    except (TimeoutError, aiohttp.ClientError, grpc.RpcError, OSError, ssl.SSLError) as e:
        log.debug("warm-up of %s at %s: %s", dep.cluster, endpoint, e)
        return False


async def endpoint_healthy(session: aiohttp.ClientSession, dep: Deployment, endpoint: str) -> bool:
    """One endpoint passes the deployment's health check, read as Envoy reads it: an HTTP GET of
    `http_path` (2xx), or the gRPC health protocol (grpc.health.v1 `Check` of `grpc_service`: SERVING)."""
    hc = dep.health_check
    assert hc is not None
    try:
        if hc.grpc_service is not None:
            return await _grpc_serving(dep, endpoint, hc.grpc_service, hc.timeout_s)
        scheme = "https" if dep.tls else "http"
        async with session.get(f"{scheme}://{endpoint}{hc.http_path}", ssl=ssl_context(dep),
                               timeout=aiohttp.ClientTimeout(total=hc.timeout_s)) as resp:
            return 200 <= resp.status < 300
    except (TimeoutError, aiohttp.ClientError, grpc.RpcError, OSError, ssl.SSLError):
        return False


async def _channel(dep: Deployment, endpoint: str) -> grpc.aio.Channel:
    if not dep.tls:
        return grpc.aio.insecure_channel(endpoint)
    ca = await asyncio.to_thread(Path(dep.tls_ca_file).read_bytes) if dep.tls_ca_file else None
    return grpc.aio.secure_channel(endpoint, grpc.ssl_channel_credentials(root_certificates=ca))


async def _grpc_serving(dep: Deployment, endpoint: str, service: str, timeout: float) -> bool:
    async with await _channel(dep, endpoint) as channel:
        resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                               timeout=timeout)
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)


async def _grpc_ready(dep: Deployment, endpoint: str, model: str, timeout: float) -> bool:
    async with await _channel(dep, endpoint) as channel:
        resp = await pb_grpc.GRPCInferenceServiceStub(channel).ModelReady(pb.ModelReadyRequest(name=model),
                                                                           timeout=timeout)
        return bool(resp.ready)
