"""Scale from zero (`scale_from_zero:`, docs/queueing.md "Scale from zero"), the way Knative's activator
holds requests for a revision with no pod: while no replica of a deployment is ready, its queue is
paused (`ConcurrencyLimits.pause`): callers wait there, bounded, by tier, and past their tier's
`max_wait_s` get 503 + retry-after. The first held caller makes `Waker` ask for a replica (the
Kubernetes scale subresource with the pod's service-account token, or a webhook; again every
`retry_s` while callers still wait); its health check is probed every `probe_s`; once it passes, the
warm-up runs, then the queue resumes and the waiters go in its order. When a ready deployment fails
`unhealthy_threshold` checks in a row, it is paused again. Scale-down is the autoscaler's: the
gateway only reports idleness (extproc/telemetry/demand.py).

Readiness is the deployment's own health check as Envoy reads it: an HTTP GET, or for a gRPC server
(KServe v2 gRPC) the gRPC health protocol (grpc.health.v1 `Check`: SERVING), and a KServe gRPC warm-up
asks `ModelReady`. A reload applies live (`reconfigure`): a deployment that gains `scale_from_zero` is
probed and held if no replica is ready; one that loses it has its held callers let go.

`scale_call` is pure (the request to send); `Waker` runs in the background, never on a request's path
(the hold callback only starts a task).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from contracts.config import Deployment, GatewayConfig
from contracts.config.scaling import ScaleFromZero
from extproc.admission.concurrency import ConcurrencyLimits
from extproc.telemetry.metrics import SCALE_FROM_ZERO_SECONDS, SCALE_READY, SCALE_REQUESTS
from extproc.telemetry.warmup import endpoint_healthy, send_warmup, warmup_call

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ScaleCall:
    method: str
    url: str
    headers: dict[str, str]  # without the bearer token (read fresh: service-account tokens rotate)
    body: bytes


def scale_call(sfz: ScaleFromZero, cluster: str, model: str) -> ScaleCall:
    """The request that asks for a replica: a merge patch of the Deployment's scale subresource, or the webhook."""
    if sfz.kubernetes is not None:
        k = sfz.kubernetes
        url = (f"{k.api_url.rstrip('/')}/apis/apps/v1/namespaces/{k.namespace}/deployments/{k.deployment}/scale")
        return ScaleCall("PATCH", url, {"content-type": "application/merge-patch+json", "accept": "application/json"},
                         orjson.dumps({"spec": {"replicas": k.replicas}}))
    assert sfz.webhook is not None
    return ScaleCall("POST", sfz.webhook, {"content-type": "application/json"},
                     orjson.dumps({"cluster": cluster, "model": model, "replicas": 1}))


class Waker:
    def __init__(self, config: GatewayConfig, limits_of: Callable[[], ConcurrencyLimits]) -> None:
        self._deps = {c: d for c, d in config.clusters().items() if d.scale_from_zero is not None}
        self._models = {d.cluster: m.name for m in config.models for d in m.deployments}
        self._limits_of = limits_of
        self._asked: dict[str, float] = {}  # cluster -> when the last scale request left (monotonic)
        self._held_since: dict[str, float] = {}  # cluster -> when its first caller was held this time
        self._tasks: set[asyncio.Task[None]] = set()
        self._watches: dict[str, asyncio.Task[None]] = {}  # cluster -> its watch
        self._session: aiohttp.ClientSession | None = None
        self._started = False

    async def start(self) -> None:
        """Probe each deployment once (a ready one serves at once), pause the others, watch them all."""
        self._started = True
        if not self._deps:
            return
        await asyncio.gather(*(self._adopt(cluster) for cluster in self._deps))

    def reconfigure(self, config: GatewayConfig) -> None:
        """A reload (on the loop, from the commit): deployments that gained `scale_from_zero` are
        probed and held until ready; those that lost it let their held callers go; changed ones are
        watched with their new settings from the next probe on."""
        deps = {c: d for c, d in config.clusters().items() if d.scale_from_zero is not None}
        self._models = {d.cluster: m.name for m in config.models for d in m.deployments}
        gone = set(self._deps) - set(deps)
        added = set(deps) - set(self._deps)
        self._deps = deps
        limits = self._limits_of()
        for cluster in gone:
            watch = self._watches.pop(cluster, None)
            if watch is not None:
                watch.cancel()
            self._asked.pop(cluster, None)
            self._held_since.pop(cluster, None)
            if cluster in limits.paused:
                log.info("deployment %s: no longer scale_from_zero; its held callers go on", cluster)
                limits.resume(cluster)
        if self._started:
            for cluster in added:
                self._spawn(self._adopt(cluster))

    async def _adopt(self, cluster: str) -> None:
        dep = self._deps.get(cluster)
        if dep is None:
            return
        if self._session is None:
            self._session = aiohttp.ClientSession()
        limits = self._limits_of()
        limits.on_hold = self._hold
        ok = await self._healthy(dep)
        if cluster not in self._deps or cluster in self._watches:  # gone, or adopted twice, meanwhile
            return
        if not ok:
            limits.pause(cluster)
        SCALE_READY.labels(cluster).set(1 if ok else 0)
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(self._watch(cluster))
        self._watches[cluster] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _hold(self, cluster: str) -> None:
        """A caller was queued on a paused deployment (on the loop, from `acquire`): ask for a replica,
        at most once every `retry_s`."""
        dep = self._deps.get(cluster)
        if dep is None or dep.scale_from_zero is None:
            return
        now = time.monotonic()
        self._held_since.setdefault(cluster, now)
        last = self._asked.get(cluster)
        if last is None or now - last >= dep.scale_from_zero.retry_s:
            self._asked[cluster] = now
            self._spawn(self._ask(cluster, dep.scale_from_zero))

    async def _ask(self, cluster: str, sfz: ScaleFromZero) -> None:
        call = scale_call(sfz, cluster, self._models[cluster])
        headers = dict(call.headers)
        ssl_ctx: ssl.SSLContext | bool = True
        outcome = "failed"
        try:
            if sfz.kubernetes is not None:
                token = (await asyncio.to_thread(Path(sfz.kubernetes.token_file).read_text)).strip()
                headers["authorization"] = f"Bearer {token}"
                ca = sfz.kubernetes.ca_file
                if call.url.startswith("https://") and ca and Path(ca).exists():
                    ssl_ctx = await asyncio.to_thread(ssl.create_default_context, cafile=ca)
            assert self._session is not None
            async with self._session.request(call.method, call.url, data=call.body, headers=headers, ssl=ssl_ctx,
                                             timeout=aiohttp.ClientTimeout(total=10)) as resp:
                await resp.read()
                outcome = "ok" if 200 <= resp.status < 300 else "refused"
                if outcome != "ok":
                    log.warning("scale request for %s: %s %s answered %d", cluster, call.method, call.url, resp.status)
        except (OSError, TimeoutError, aiohttp.ClientError, ssl.SSLError) as e:
            log.warning("scale request for %s: %s %s failed: %s", cluster, call.method, call.url, e)
        SCALE_REQUESTS.labels(cluster, outcome).inc()
        if outcome == "ok":
            log.info("deployment %s: asked for a replica (%s %s)", cluster, call.method, call.url)

    async def _watch(self, cluster: str) -> None:
        fails = 0
        while (dep := self._deps.get(cluster)) is not None:  # the current config's, reloads included
            hc, sfz = dep.health_check, dep.scale_from_zero
            assert hc is not None and sfz is not None
            limits = self._limits_of()
            paused = cluster in limits.paused
            await asyncio.sleep(sfz.probe_s if paused else hc.interval_s)
            if cluster not in self._deps:
                return
            ok = await self._healthy(dep)
            if paused and ok:
                await self._warm(dep)
                held = self._held_since.pop(cluster, None)
                self._asked.pop(cluster, None)
                if held is not None:
                    SCALE_FROM_ZERO_SECONDS.labels(cluster).observe(time.monotonic() - held)
                log.info("deployment %s: a replica is ready; serving its queue", cluster)
                SCALE_READY.labels(cluster).set(1)
                self._limits_of().resume(cluster)
                fails = 0
            elif not paused:
                fails = 0 if ok else fails + 1
                if fails >= hc.unhealthy_threshold:
                    log.warning("deployment %s: no replica passes its health check; holding callers", cluster)
                    SCALE_READY.labels(cluster).set(0)
                    limits.pause(cluster)

    async def _healthy(self, dep: Deployment) -> bool:
        """Any endpoint passes the deployment's health check (HTTP, or gRPC health for a gRPC server)."""
        assert self._session is not None
        for ep in dep.endpoints:
            if await endpoint_healthy(self._session, dep, ep):
                return True
        return False

    async def _warm(self, dep: Deployment) -> None:
        """The deployment's warm-up before its first caller: sent until answered or its timeout passes."""
        if dep.warmup is None:
            return
        call = warmup_call(dep, self._models[dep.cluster])
        assert self._session is not None
        deadline = time.monotonic() + dep.warmup.timeout_s
        while time.monotonic() < deadline:
            if await send_warmup(self._session, dep, call, dep.endpoints[0], dep.warmup.timeout_s):
                return
            await asyncio.sleep(dep.warmup.retry_interval_s)
        log.warning("deployment %s: warm-up unanswered; serving its queue anyway", dep.cluster)
