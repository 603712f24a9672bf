"""The async shell around the pure per-deployment queues (extproc.routing.queueing).

`Dispatcher` awaits `ConcurrencyLimits.acquire` between admission and dispatch: it returns at once
with a slot when one is free, waits in the deployment's queue otherwise, and raises when the queue
refuses (429: the tenant's own share; 503 + retry-after: capacity, or the tier's max wait passed).
The `Slot` rides on the `Choice`; the `Accountant` releases it wherever an answer ends (done, upstream
error, stream end, client reset), which grants the next waiter. A caller that leaves while waiting
(its ext_proc stream is cancelled) is taken out of the queue; one granted a slot in that instant
hands it straight on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import lru_cache

from prometheus_client import Gauge, Histogram

from contracts.config import GatewayConfig
from contracts.config.queueing import TIERS
from contracts.config.service_levels import Tier
from extproc.routing.queueing import DeploymentQueue, Refusal, Ticket
from extproc.telemetry.metrics import INFLIGHT, QUEUE_DEPTH, QUEUE_REFUSED, QUEUE_WAIT
from modelyard.errors import ClientError, Unavailable


class Slot:
    """One request's hold on a deployment's slot; `release` is idempotent."""

    __slots__ = ("_limits", "cluster", "ticket")

    def __init__(self, limits: ConcurrencyLimits, cluster: str, ticket: Ticket) -> None:
        self._limits = limits
        self.cluster = cluster
        self.ticket = ticket

    @property
    def waited_s(self) -> float:
        return self.ticket.waited()

    def release(self) -> None:
        self._limits.release(self.cluster, self.ticket)


class ConcurrencyLimits:
    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.queues: dict[str, DeploymentQueue] = {
            name: DeploymentQueue(d.max_inflight, d.queue) for name, d in config.clusters().items() if d.max_inflight}
        self._waiters: dict[Ticket, tuple[asyncio.Future[None], str]] = {}  # waiting ticket -> (wake-up, model)
        # (in flight + waiting) / max_inflight per limited deployment, kept current: the scheduler reads it as load.
        self.occupancy: dict[str, float] = {}
        # Label children per cluster, looked up once: `labels()` costs more than the update.
        self._inflight: dict[str, Gauge] = {name: INFLIGHT.labels(name) for name in self.queues}
        for name in self.queues:
            self._show(name)
            for tier in TIERS:
                for reason in ("tenant_share", "bound", "max_wait"):
                    QUEUE_REFUSED.labels(name, tier, reason)
        # Every (model, cluster, tier) series exists from the start: dashboards show 0, not "no data".
        for m in config.models:
            for d in m.deployments:
                if d.cluster in self.queues:
                    for tier in TIERS:
                        _depth_series(m.name, d.cluster, tier)
                        _wait_series(m.name, d.cluster, tier)

    def __contains__(self, cluster: str) -> bool:
        return cluster in self.queues

    async def acquire(self, cluster: str, model: str, tenant: str, tier: Tier) -> Slot | None:
        """A slot on `cluster` (None when it has no limit); waits in its queue when all are taken."""
        q = self.queues.get(cluster)
        if q is None:
            return None
        ticket = Ticket(tenant, tier, self.clock())
        refusal = q.offer(ticket, ticket.arrived)
        if refusal is not None:
            raise _refused(cluster, model, tier, refusal)
        if ticket.state == "granted":
            _wait_series(model, cluster, tier).observe(0.0)
            self._show(cluster)
            return Slot(self, cluster, ticket)
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        self._waiters[ticket] = (woken, model)
        _depth_series(model, cluster, tier).inc()
        self._show(cluster)
        timer = loop.call_later(q.settings.max_wait_s[tier], self._expire, cluster, q, ticket)
        try:
            await woken
        except asyncio.CancelledError:
            # The caller left: out of the queue, or, if a slot came in this very instant, pass it on.
            if not self._leave(cluster, q, ticket):
                self.release(cluster, ticket)
            raise
        finally:
            timer.cancel()
        return Slot(self, cluster, ticket)

    def release(self, cluster: str, ticket: Ticket) -> None:
        q = self.queues[cluster]
        nxt = q.release(ticket, self.clock())
        if nxt is not None:
            woken, model = self._waiters.pop(nxt)
            _depth_series(model, cluster, nxt.tier).dec()
            _wait_series(model, cluster, nxt.tier).observe(nxt.waited())
            if not woken.done():
                woken.set_result(None)
        self._show(cluster)

    # -- private -----------------------------------------------------------------------------

    def _leave(self, cluster: str, q: DeploymentQueue, ticket: Ticket) -> bool:
        """Take a waiting ticket out of the queue; False when it had been granted meanwhile."""
        if not q.withdraw(ticket):
            return False
        _, model = self._waiters.pop(ticket)
        _depth_series(model, cluster, ticket.tier).dec()
        self._show(cluster)
        return True

    def _expire(self, cluster: str, q: DeploymentQueue, ticket: Ticket) -> None:
        entry = self._waiters.get(ticket)
        if entry is None or not self._leave(cluster, q, ticket):
            return
        woken, model = entry
        QUEUE_REFUSED.labels(cluster, ticket.tier, "max_wait").inc()
        if not woken.done():
            wait = q.settings.max_wait_s[ticket.tier]
            woken.set_exception(Unavailable(f"{model!r} had no free capacity within {wait:g}s; retry later",
                                            retry_after_s=q.retry_after_s(ticket.tier)))

    def _show(self, cluster: str) -> None:
        q = self.queues[cluster]
        self.occupancy[cluster] = q.occupancy
        self._inflight[cluster].set(q.inflight)

    def state(self, cluster: str) -> str:
        """ready, busy (every slot taken) or queueing; ready for a deployment without a limit."""
        q = self.queues.get(cluster)
        if q is None:
            return "ready"
        return "queueing" if q.waiting() else "busy" if q.inflight >= q.max_inflight else "ready"


def _refused(cluster: str, model: str, tier: Tier, refusal: Refusal) -> ClientError | Unavailable:
    QUEUE_REFUSED.labels(cluster, tier, refusal.reason).inc()
    if refusal.status == 429:
        return ClientError(f"too many of your requests are waiting for {model!r}; retry in "
                           f"{refusal.retry_after_s:.0f}s", status=429,
                           headers=[("retry-after", str(int(refusal.retry_after_s)))])
    return Unavailable(f"{model!r} is at capacity and its queue is full; retry later",
                       retry_after_s=refusal.retry_after_s)


@lru_cache(maxsize=4096)
def _depth_series(model: str, cluster: str, tier: str) -> Gauge:
    return QUEUE_DEPTH.labels(model, cluster, tier)


@lru_cache(maxsize=4096)
def _wait_series(model: str, cluster: str, tier: str) -> Histogram:
    return QUEUE_WAIT.labels(model, cluster, tier)
