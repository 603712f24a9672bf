"""One deployment's concurrency slots and the queue in front of them, as pure state (no I/O, no clock).

At most `max_inflight` requests hold a slot. Past that a request waits: tiers in strict priority
(L1 before L2 before L3), and within a tier, fair across tenants by start-time fair queuing: each
tenant's next request gets the virtual start tag max(V, that tenant's last finish tag), every request
costs one slot, and the smallest tag goes first. A tenant that floods only pushes its own tags ahead,
so another tenant's request waits behind at most one of the flooder's per round.

A request is refused when its tier's queue is full (`bound`: 503, capacity) or when its tenant
already holds its share of that bound (`tenant_share`: 429, its own share). The shell (extproc.admission.concurrency)
enforces the max wait per tier with a timer and calls `withdraw`; every slot is handed back with
`release`, which grants the next waiter.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

from contracts.config.queueing import TIERS, QueueSettings
from contracts.config.service_levels import Tier

TicketState = Literal["waiting", "granted", "released", "withdrawn", "refused"]
RefusalReason = Literal["tenant_share", "bound"]
# The slot hold time assumed before any request has finished (seconds), and the EWMA weight of a new one.
_PRIOR_HOLD_S = 1.0
_HOLD_ALPHA = 0.2


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place: waiting, then granted a slot, then released (or withdrawn / refused)."""

    tenant: str
    tier: Tier
    arrived: float
    seq: int = 0
    start_tag: float = 0.0
    granted_at: float | None = None
    state: TicketState = "waiting"

    def waited(self) -> float:
        return 0.0 if self.granted_at is None else self.granted_at - self.arrived


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: RefusalReason
    retry_after_s: float

    @property
    def status(self) -> int:
        """429 when the tenant exceeded its own share (its fault); 503 when capacity ran out."""
        return 429 if self.reason == "tenant_share" else 503


@dataclass(slots=True)
class _TierQueue:
    heap: list[tuple[float, int, Ticket]] = field(default_factory=list)
    virtual_time: float = 0.0  # the start tag of the last request granted from this tier
    finish: dict[str, float] = field(default_factory=dict)  # each tenant's last finish tag
    by_tenant: dict[str, int] = field(default_factory=dict)  # waiting now, per tenant
    waiting: int = 0


class DeploymentQueue:
    def __init__(self, max_inflight: int, settings: QueueSettings) -> None:
        self.max_inflight = max_inflight
        self.settings = settings
        self.inflight = 0
        self.hold_s = _PRIOR_HOLD_S  # EWMA of how long a request holds a slot
        self._tiers: dict[Tier, _TierQueue] = {t: _TierQueue() for t in TIERS}
        self._seq = itertools.count()
        self._waiting = 0  # across tiers: the free-slot test runs on every request

    # -- the four moves ----------------------------------------------------------------------

    def has_room(self) -> bool:
        """A slot is free here and nobody waits for one: an offer now would be granted."""
        return self.inflight < self.max_inflight and self._waiting == 0

    def refusal_reason(self, tenant: str, tier: Tier) -> RefusalReason | None:
        """What `offer` would refuse a ticket of `tenant` for now, without offering one (spill asks
        this before sending a call to a peer deployment)."""
        if self.has_room():
            return None
        tq = self._tiers[tier]
        if tq.waiting >= self.settings.bound[tier]:
            return "bound"
        if tq.by_tenant.get(tenant, 0) >= self.settings.tenant_cap(tier):
            return "tenant_share"
        return None

    def offer(self, ticket: Ticket, now: float, room: bool = True) -> Refusal | None:
        """Grant a slot now (ticket.state == "granted"), queue the ticket ("waiting"), or refuse it.
        `room=False`: the host's other workers hold the rest of the slots, so queue even if free here."""
        ticket.seq = next(self._seq)
        if room and self.inflight < self.max_inflight and self._waiting == 0:
            self._grant(ticket, now)
            return None
        tq = self._tiers[ticket.tier]
        s = self.settings
        if tq.waiting >= s.bound[ticket.tier]:
            ticket.state = "refused"
            return Refusal("bound", self.retry_after_s(ticket.tier))
        if tq.by_tenant.get(ticket.tenant, 0) >= s.tenant_cap(ticket.tier):
            ticket.state = "refused"
            # Its own requests ahead must drain first, one per round of the tier's tenants.
            rounds = tq.by_tenant[ticket.tenant] * max(1, len([n for n in tq.by_tenant.values() if n]))
            return Refusal("tenant_share", self._eta(min(rounds, self._ahead_of(ticket.tier) + 1)))
        ticket.start_tag = max(tq.virtual_time, tq.finish.get(ticket.tenant, 0.0))
        tq.finish[ticket.tenant] = ticket.start_tag + 1.0
        heapq.heappush(tq.heap, (ticket.start_tag, ticket.seq, ticket))
        tq.by_tenant[ticket.tenant] = tq.by_tenant.get(ticket.tenant, 0) + 1
        tq.waiting += 1
        self._waiting += 1
        ticket.state = "waiting"
        return None

    def release(self, ticket: Ticket, now: float, hand_on: bool = True) -> Ticket | None:
        """`ticket` hands its slot back; the next waiter, if any, is granted it and returned
        (`hand_on=False`: the deployment is paused, waiters stay until it resumes)."""
        if ticket.state != "granted":
            return None  # released twice, or never granted: nothing to hand back
        ticket.state = "released"
        self.inflight -= 1
        if ticket.granted_at is not None:
            self.hold_s += _HOLD_ALPHA * (max(0.0, now - ticket.granted_at) - self.hold_s)
        nxt = self._pop_next() if self._waiting and hand_on else None
        if nxt is not None:
            self._grant(nxt, now)
        return nxt

    def grant_next(self, now: float) -> Ticket | None:
        """A slot came free elsewhere (another worker's): grant it to the next waiter, if any."""
        if self.inflight >= self.max_inflight:
            return None
        nxt = self._pop_next() if self._waiting else None
        if nxt is not None:
            self._grant(nxt, now)
        return nxt

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a waiting ticket out (it timed out, or its caller left); False when it was not waiting."""
        if ticket.state != "waiting":
            return False
        ticket.state = "withdrawn"
        tq = self._tiers[ticket.tier]
        tq.waiting -= 1
        self._waiting -= 1
        self._tenant_left(tq, ticket.tenant)
        # Lazy deletion: the heap entry is skipped when it surfaces; rebuild when mostly dead.
        if len(tq.heap) > 32 and len(tq.heap) > 4 * tq.waiting:
            tq.heap = [e for e in tq.heap if e[2].state == "waiting"]
            heapq.heapify(tq.heap)
        return True

    def drain(self) -> list[Ticket]:
        """Withdraw every waiting ticket (the deployment is gone) and return them, in no order."""
        out = [t for tq in self._tiers.values() for _, _, t in tq.heap if t.state == "waiting"]
        for t in out:
            self.withdraw(t)
        return out

    # -- reading the state -------------------------------------------------------------------

    def waiting(self, tier: Tier | None = None) -> int:
        return self._waiting if tier is None else self._tiers[tier].waiting

    def waiting_for(self, tenant: str, tier: Tier) -> int:
        return self._tiers[tier].by_tenant.get(tenant, 0)

    def retry_after_s(self, tier: Tier) -> float:
        """When a new request of `tier` might find room: everyone ahead of it served, at the observed pace."""
        return self._eta(self._ahead_of(tier) + 1)

    @property
    def occupancy(self) -> float:
        """Slots in use over slots, plus waiters: 1.0 is full, above 1 a queue is building."""
        return (self.inflight + self.waiting()) / self.max_inflight

    # -- private -----------------------------------------------------------------------------

    def _grant(self, ticket: Ticket, now: float) -> None:
        ticket.state = "granted"
        ticket.granted_at = now
        self.inflight += 1

    def _pop_next(self) -> Ticket | None:
        for tier in TIERS:
            tq = self._tiers[tier]
            while tq.heap:
                tag, _, ticket = heapq.heappop(tq.heap)
                if ticket.state != "waiting":
                    continue
                tq.virtual_time = tag
                tq.waiting -= 1
                self._waiting -= 1
                self._tenant_left(tq, ticket.tenant)
                return ticket
        return None

    @staticmethod
    def _tenant_left(tq: _TierQueue, tenant: str) -> None:
        n = tq.by_tenant[tenant] - 1
        if n:
            tq.by_tenant[tenant] = n
        else:
            del tq.by_tenant[tenant]

    def _ahead_of(self, tier: Tier) -> int:
        """Requests that go before a new one of `tier`: every waiter of its tier and the tiers above."""
        return sum(self._tiers[t].waiting for t in TIERS[: TIERS.index(tier) + 1])

    def _eta(self, requests: int) -> float:
        """Seconds until `requests` more have been served, at the observed hold time; at least 1."""
        return max(1.0, math.ceil(requests * self.hold_s / self.max_inflight))
