"""The async shell around the pure per-deployment queues (extproc.routing.queueing).

`Dispatcher` awaits `ConcurrencyLimits.acquire` between admission and dispatch: it returns at once
with a slot when one is free, waits in the deployment's queue otherwise, and raises when the queue
refuses (429: the tenant's own share; 503 + retry-after: capacity, or the tier's max wait passed).
The `Slot` rides on the `Choice`; the `Accountant` releases it wherever an answer ends (done, upstream
error, stream end, client reset), which grants the next waiter. A caller that leaves while waiting
(its ext_proc stream is cancelled) is taken out of the queue; one granted a slot in that instant
hands it straight on.

With several workers on a host (`extproc.workers`), `max_inflight` is the host's: each grant also
takes a slot in the shared table (extproc/admission/host_slots.py); with the Redis rate-limit backend, a
lease in Redis shared by every replica (extproc/admission/redis_slots.py). A request queues here while the
other processes hold the rest, and a waiter is granted when a slot comes back: here at once, or
from another process within one `POLL_S`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache

from prometheus_client import Gauge, Histogram

from contracts.config import GatewayConfig
from contracts.config.queueing import TIERS, QueueSettings
from contracts.config.service_levels import Tier
from contracts.errors import ClientError, ModelyardError, Unavailable, UnknownModel
from extproc.admission.host_slots import HostSlots
from extproc.admission.redis_slots import RedisSlots
from extproc.routing.queueing import DeploymentQueue, Refusal, Ticket
from extproc.telemetry.demand import Load
from extproc.telemetry.metrics import INFLIGHT, QUEUE_DEPTH, QUEUE_REFUSED, QUEUE_WAIT

# How often a process with waiters looks for a slot another process handed back.
POLL_S = 0.005


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


@dataclass(frozen=True)
class LimitsPlan:
    """A config's slots and queues, built and checked before anything changes (`ConcurrencyLimits.apply`)."""

    limits: dict[str, tuple[int, QueueSettings]]  # cluster -> (max_inflight, this worker's queue settings)
    models: frozenset[str]  # the models the config still has: a removed deployment's waiters learn which error
    host: HostSlots | None  # a new host slot table, when the set of limited deployments changed

    def discard(self) -> None:
        """Not applied after all (another part of the config was refused)."""
        if self.host is not None:
            self.host.close()


class ConcurrencyLimits:
    def __init__(self, config: GatewayConfig, clock: Callable[[], float] = time.monotonic,
                 host: tuple[str, int] | None = None, redis_url: str | None = None, workers: int = 1) -> None:
        """`host`: (the shared slot tables' file prefix, this worker's index) when one of several workers;
        `redis_url`: lease the slots in Redis instead, shared by every replica and worker;
        `workers`: the host's worker count, among which each queue bound is divided exactly."""
        self.clock = clock
        self._host, self._workers = host, workers
        index = host[1] if host is not None else 0
        self.queues: dict[str, DeploymentQueue] = {
            name: DeploymentQueue(d.max_inflight, _share(d.queue, index, workers))
            for name, d in config.clusters().items() if d.max_inflight}
        # Deployments a reload removed while requests still held their slots: released here, never granted again.
        self._retired: dict[str, DeploymentQueue] = {}
        self.shared: HostSlots | RedisSlots | None = None
        if redis_url is not None and self.queues:
            rc = config.ratelimit.redis
            self.shared = RedisSlots(redis_url, self.queues, prefix=rc.key_prefix, timeout_ms=rc.timeout_ms)
        elif host is not None and self.queues:
            self.shared = HostSlots(host_table(host[0], self.queues), self.queues, host[1])
        self._redis, self._redis_settings = redis_url, config.ratelimit.redis
        self._polls: dict[str, asyncio.Task[None]] = {}
        self._waiters: dict[Ticket, tuple[asyncio.Future[None], str]] = {}  # waiting ticket -> (wake-up, model)
        # (in flight + waiting) / max_inflight per limited deployment, kept current: the scheduler reads it as load.
        self.occupancy: dict[str, float] = {}
        # Deployments with no replica ready (scale_from_zero): every caller queues; `on_hold` hears of each.
        self.paused: set[str] = set()
        self.on_hold: Callable[[str], None] | None = None
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

    def refusal_reason(self, cluster: str, tenant: str, tier: Tier) -> str | None:
        """Whether `cluster`'s queue would refuse this caller now ("bound", "tenant_share"), else None."""
        q = self.queues.get(cluster)
        return None if q is None else q.refusal_reason(tenant, tier)

    async def acquire(self, cluster: str, model: str, tenant: str, tier: Tier) -> Slot | None:
        """A slot on `cluster` (None when it has no limit); waits in its queue when all are taken."""
        q = self.queues.get(cluster)
        if q is None:
            return None
        # A shared slot first when one would be granted here; without one, the ticket queues.
        paused = cluster in self.paused
        took = not paused and self.shared is not None and q.has_room() and await self._take(cluster, q.max_inflight)
        room = not paused and (self.shared is None or took)
        ticket = Ticket(tenant, tier, self.clock())
        refusal = q.offer(ticket, ticket.arrived, room)
        if refusal is not None:
            if took:
                self._give(cluster)
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
        if took:  # others came in while Redis answered: the slot we took goes to the queue's next
            self._grant_or_give(cluster)
        if self.shared is not None and cluster not in self._polls and not paused:
            self._polls[cluster] = loop.create_task(self._poll(cluster))
        if paused and self.on_hold is not None:
            self.on_hold(cluster)
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
        q = self.queues.get(cluster)
        if q is None:  # its deployment was removed by a reload: nobody waits there any more
            gone = self._retired.get(cluster)
            if gone is not None:
                if ticket.state == "granted":
                    gone.release(ticket, self.clock())
                    self._give(cluster)
                if not gone.inflight:
                    del self._retired[cluster]
            return
        held = ticket.state == "granted"
        nxt = q.release(ticket, self.clock(), hand_on=cluster not in self.paused)
        if nxt is not None:  # the slot goes straight to the next waiter here
            self._wake(cluster, nxt)
        elif held:
            self._give(cluster)
        self._show(cluster)

    # -- live reload (extproc/live/reload.py) -----------------------------------------------------

    def plan(self, config: GatewayConfig) -> LimitsPlan:
        """The new config's slots and queues, checked; nothing here changes until `apply`."""
        index = self._host[1] if self._host is not None else 0
        limits = {name: (d.max_inflight, _share(d.queue, index, self._workers))
                  for name, d in config.clusters().items() if d.max_inflight}
        host = None
        if self._host is not None and self._redis is None and limits and (
                not isinstance(self.shared, HostSlots) or set(limits) != set(self.queues)):
            # Another set of deployments is another table; what this worker holds moves with it.
            known = {**self._retired, **self.queues}  # a retired queue that comes back brings its slots in use
            held = {c: known[c].inflight for c in limits if c in known}
            host = HostSlots(host_table(self._host[0], limits), limits, index, holding=held)
        return LimitsPlan(limits, frozenset(m.name for m in config.models), host)

    def apply(self, plan: LimitsPlan) -> None:
        """Swap in `plan` (synchronous, cannot fail): a deployment that stays keeps its queue, its waiters and
        its slots, with the new `max_inflight` for the next grants; a new one starts empty; a removed one's
        waiters get an error at once (never a hang) and its slots in use are handed back where they were."""
        now = self.clock()
        for name in [c for c in self.queues if c not in plan.limits]:
            q = self.queues.pop(name)
            self.occupancy.pop(name, None)
            self._inflight[name].set(0)
            for ticket in q.drain():
                self._gone(name, ticket, plan.models)
            if q.inflight:
                self._retired[name] = q
        if plan.host is not None:
            old = self.shared
            self.shared = plan.host
            if isinstance(old, HostSlots):
                old.close()
        elif isinstance(self.shared, RedisSlots):
            self.shared.track(plan.limits)
        elif self._redis is not None and self.shared is None and plan.limits:
            rc = self._redis_settings
            self.shared = RedisSlots(self._redis, plan.limits, prefix=rc.key_prefix, timeout_ms=rc.timeout_ms)
        for name, (max_inflight, settings) in plan.limits.items():
            found = self.queues.get(name) or self._retired.pop(name, None)
            if found is None:
                found = DeploymentQueue(max_inflight, settings)
                self._inflight[name] = INFLIGHT.labels(name)
            q = found
            q.max_inflight, q.settings = max_inflight, settings  # the next grants see them
            self.queues[name] = q
            if name in self.paused:  # no replica ready yet: the waiters stay until `resume`
                pass
            elif self.shared is None:  # more slots now: waiters here take them at once
                while (nxt := q.grant_next(now)) is not None:
                    self._wake(name, nxt)
            elif q.waiting() and name not in self._polls:
                self._polls[name] = asyncio.get_running_loop().create_task(self._poll(name))
            self._show(name)

    def _gone(self, cluster: str, ticket: Ticket, models: frozenset[str]) -> None:
        """A waiter whose deployment a reload removed: the error for a model that is gone, or a retry."""
        woken, model = self._waiters.pop(ticket)
        _depth_series(model, cluster, ticket.tier).dec()
        if woken.done():
            return
        err: ModelyardError
        if model not in models:
            err = UnknownModel(f"The model `{model}` does not exist or you do not have access to it.")
        else:
            err = Unavailable(f"{model!r}: the deployment this request waited for was removed; retry",
                              retry_after_s=1)
        woken.set_exception(err)

    async def close(self) -> None:
        for task in self._polls.values():
            task.cancel()
        await asyncio.gather(*self._polls.values(), return_exceptions=True)
        self._polls.clear()
        if isinstance(self.shared, RedisSlots):
            await self.shared.aclose()
        elif self.shared is not None:
            self.shared.close()

    # -- private -----------------------------------------------------------------------------

    def _wake(self, cluster: str, nxt: Ticket) -> None:
        woken, model = self._waiters.pop(nxt)
        _depth_series(model, cluster, nxt.tier).dec()
        _wait_series(model, cluster, nxt.tier).observe(nxt.waited())
        if not woken.done():
            woken.set_result(None)

    async def _take(self, cluster: str, limit: int) -> bool:
        s = self.shared
        if s is None:
            return True
        return s.take(cluster, limit) if isinstance(s, HostSlots) else await s.take(cluster, limit)

    def _give(self, cluster: str) -> None:
        if self.shared is not None and cluster in self.shared:
            self.shared.give(cluster)

    def _grant_or_give(self, cluster: str) -> bool:
        """A shared slot taken for this queue: to its next waiter, or back when none can have it."""
        nxt = self.queues[cluster].grant_next(self.clock())
        if nxt is None:
            self._give(cluster)
            return False
        self._wake(cluster, nxt)
        return True

    async def _poll(self, cluster: str) -> None:
        """Waiters here while the others held every slot: take the slots they hand back."""
        q = self.queues[cluster]
        try:
            while q.waiting():
                await asyncio.sleep(POLL_S)
                while (q.waiting() and cluster not in self.paused and q.inflight < q.max_inflight
                       and await self._take(cluster, q.max_inflight)):
                    if not self._grant_or_give(cluster):
                        break
                self._show(cluster)
        finally:
            self._polls.pop(cluster, None)

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

    def pause(self, cluster: str) -> None:
        """No replica of `cluster` is ready: callers from now on wait in its queue."""
        self.paused.add(cluster)

    def resume(self, cluster: str) -> None:
        """A replica is ready (and warmed): the waiters go, in the queue's order, as slots allow."""
        self.paused.discard(cluster)
        q = self.queues.get(cluster)
        if q is None:
            return
        if self.shared is None:
            while (nxt := q.grant_next(self.clock())) is not None:
                self._wake(cluster, nxt)
        elif q.waiting() and cluster not in self._polls:
            self._polls[cluster] = asyncio.get_running_loop().create_task(self._poll(cluster))
        self._show(cluster)

    def loads(self) -> dict[str, Load]:
        """Each limited deployment's slots now (the demand signals read them at scrape time)."""
        return {name: Load(q.inflight, q.waiting(), q.max_inflight) for name, q in list(self.queues.items())}

    def state(self, cluster: str) -> str:
        """ready, busy (every slot taken) or queueing; ready for a deployment without a limit."""
        q = self.queues.get(cluster)
        if q is None:
            return "ready"
        return "queueing" if q.waiting() else "busy" if q.inflight >= q.max_inflight else "ready"


def host_table(prefix: str, clusters: Iterable[str]) -> str:
    """The host slot table's file for this set of limited deployments (workers with the same set share it)."""
    names = "\n".join(sorted(clusters)).encode()
    return f"{prefix}-{hashlib.sha256(names).hexdigest()[:12]}"


def _share(settings: QueueSettings, index: int, workers: int) -> QueueSettings:
    """Worker `index`'s part of each tier's queue bound: the parts add up to the bound exactly
    (its queue order is its own, so the bound is divided, not shared)."""
    if workers <= 1:
        return settings
    bound = {t: n // workers + (1 if index < n % workers else 0) for t, n in settings.bound.items()}
    return settings.model_copy(update={"bound": bound})


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
