"""Dynamic batching of image inference across callers (see docs/batching.md).

Requests for the same (model, cluster, per-row input shape, datatype) that arrive close together
join one `Batch`. When the batch is flushed, its first member becomes the leader: its ext_proc
stream carries the merged tensor upstream through Envoy (retries, load balancing, stats all
apply). When the leader's reply comes back it calls `Batcher.complete`, and every other member's
future resolves with the reply and its row offset; each member cuts its own slice
(`adapters.kserve.slice_response`) and answers with an immediate response. If the leader fails (`Batcher.fail`),
every other member is told to fall back to its own upstream call.

When a batch is flushed:
- at once when its rows reach the target: `min_size` while nothing is in flight for the key,
  growing with the rows in flight (queue depth) up to `max_size` (hard cap 32 rows);
- otherwise when `max_delay` has passed since its first member joined, as long as fewer than
  `max_inflight` batches of the key are upstream. While the model is busy the batch keeps filling
  (the device could not start it sooner anyway) until an in-flight batch returns, it is full, or
  `hold_cap_s` has passed.

Pure asyncio: no I/O here, futures and timers only, so tests drive it without Envoy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from contracts.config import BatchingConfig
from extproc.telemetry.metrics import BATCH_FALLBACKS, BATCH_MEMBERS, BATCH_QUEUE_DELAY, BATCH_SIZE

HARD_CAP = 32  # rows (images) per merged call, whatever the config says: a guard against OOM


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Requests batch together only when all of this matches."""

    model: str
    cluster: str
    shape: tuple[int, ...]  # one row's shape, e.g. (3, H, W); () for text
    datatype: str
    variant: Hashable = None  # anything else members must share (an embeddings request's merge key)


# A waiting member's part: lead the batch, take a result cut from the leader's reply, or fall back.
Role = Literal["leader", "result", "fallback"]
# open -> dispatched (the leader carries it upstream) -> done
BatchState = Literal["open", "dispatched", "done"]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_delay_s: float = 0.005
    min_size: int = 4
    max_size: int = 16
    max_inflight: int = 1  # batches of one key upstream at once (about one per device)

    @classmethod
    def from_config(cls, cfg: BatchingConfig, endpoints: int = 1) -> BatchPolicy:
        """From the model's batching config; one in-flight batch per endpoint."""
        max_size = max(1, min(int(cfg.max_size), HARD_CAP))
        return cls(max_delay_s=float(cfg.max_delay_ms) / 1000.0, min_size=max(1, min(int(cfg.min_size), max_size)),
                   max_size=max_size, max_inflight=max(1, int(endpoints)))


@dataclass(slots=True)
class Outcome:
    """What a waiting member learns: lead the batch, take a result, or fall back to its own call."""

    role: Role
    batch: Batch | None = None
    response: Any = None
    start: int = 0
    reason: str = ""


@dataclass(eq=False, slots=True)
class Member:
    payload: Any
    rows: int
    future: asyncio.Future
    joined: float
    batch: Batch | None = None
    start: int = 0
    gone: bool = False


@dataclass(eq=False)
class Batch:
    key: BatchKey
    policy: BatchPolicy
    opened: float
    members: list[Member] = field(default_factory=list)
    rows: int = 0
    state: BatchState = "open"
    due: bool = False  # max_delay passed while the key was busy: flush when it frees up
    leader: Member | None = None
    dispatched_at: float = 0.0
    _timers: list[asyncio.TimerHandle] = field(default_factory=list)

    @property
    def live(self) -> list[Member]:
        return [m for m in self.members if not m.gone]


class Batcher:
    def __init__(self, *, hold_cap_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 on_flush: Callable[[Batch], None] | None = None,
                 on_fallback: Callable[[Batch, int], None] | None = None):
        self.hold_cap_s = hold_cap_s
        self.clock = clock
        self._open: dict[BatchKey, Batch] = {}
        self._inflight: dict[BatchKey, list[Batch]] = {}
        self._on_flush = on_flush or _observe_flush
        self._on_fallback = on_fallback or _observe_fallback

    # -- members -----------------------------------------------------------------------------
    def join(self, key: BatchKey, policy: BatchPolicy, payload: Any, rows: int,
             arrived: float | None = None) -> Member | None:
        """Join the key's open batch (opening one if needed); None: too big to batch, go alone.
        `arrived` (this clock): when the request reached the gateway; a batch it opens leaves
        `max_delay` after that, not after the join."""
        if rows < 1 or rows > policy.max_size or policy.max_size <= 1:
            return None
        loop = asyncio.get_running_loop()
        batch = self._open.get(key)
        if batch is not None and batch.rows + rows > policy.max_size:
            self._flush(batch)  # full: it goes now, the newcomer opens the next one
            batch = self._open.get(key)
        if batch is None:
            batch = Batch(key, policy, self.clock())
            self._open[key] = batch
            now = self.clock()
            delay = max(0.0, policy.max_delay_s - max(0.0, now - arrived)) if arrived is not None else policy.max_delay_s
            batch._timers.append(loop.call_later(delay, self._deadline, batch))
            batch._timers.append(loop.call_later(delay + self.hold_cap_s, self._flush, batch))
        m = Member(payload, rows, loop.create_future(), self.clock(), batch, batch.rows)
        batch.members.append(m)
        batch.rows += rows
        if batch.rows >= self._target(batch):
            self._flush(batch)
        return m

    async def wait(self, member: Member, timeout: float | None = None) -> Outcome:
        """The member's outcome; on timeout it leaves and is told to fall back."""
        try:
            return await asyncio.wait_for(asyncio.shield(member.future), timeout)
        except TimeoutError:
            self.leave(member)
            return Outcome("fallback", member.batch, reason="timed out waiting for the batch")
        except asyncio.CancelledError:
            self.leave(member)
            raise

    def leave(self, member: Member) -> None:
        """The member's client went away (or it stopped waiting): drop it, disturb nobody else."""
        if member.gone:
            return
        member.gone = True
        if not member.future.done():
            member.future.cancel()
        batch = member.batch
        if batch is None:
            return
        if batch.state == "open":
            batch.members.remove(member)
            batch.rows -= member.rows
            self._renumber(batch)
            if not batch.members:
                self._close_open(batch)
        elif batch.state == "dispatched" and member is batch.leader:
            self.fail(batch, "the leader's stream ended before its reply")
        # Dispatched and not the leader: its rows stay in the merged call; the slice is discarded.

    # -- the leader reports ------------------------------------------------------------------
    def complete(self, batch: Batch, response: Any) -> None:
        """The merged reply arrived: every waiting member gets it with its row offset."""
        if batch.state != "dispatched":
            return
        self._done(batch)
        for m in batch.members:
            if m is not batch.leader and not m.gone and not m.future.done():
                m.future.set_result(Outcome("result", batch, response, m.start))

    def fail(self, batch: Batch, reason: str) -> None:
        """The merged call failed: every other member makes its own upstream call instead."""
        if batch.state != "dispatched":
            return
        self._done(batch)
        waiting = [m for m in batch.members if m is not batch.leader and not m.gone and not m.future.done()]
        for m in waiting:
            m.future.set_result(Outcome("fallback", batch, reason=reason))
        if waiting:
            self._on_fallback(batch, len(waiting))

    # -- introspection -----------------------------------------------------------------------
    def queue_rows(self, key: BatchKey) -> int:
        """Rows waiting or upstream for a key: the queue depth the target adapts to."""
        open_rows = self._open[key].rows if key in self._open else 0
        return open_rows + sum(b.rows for b in self._inflight.get(key, ()))

    def inflight(self, key: BatchKey) -> int:
        return len(self._inflight.get(key, ()))

    async def close(self) -> None:
        for batch in list(self._open.values()):
            for m in batch.members:
                if not m.future.done():
                    m.future.set_result(Outcome("fallback", batch, reason="batcher closed"))
            self._close_open(batch)
        for batches in list(self._inflight.values()):
            for b in list(batches):
                self.fail(b, "batcher closed")

    # -- internals ---------------------------------------------------------------------------
    def _target(self, batch: Batch) -> int:
        p = batch.policy
        return max(p.min_size, min(p.max_size, self.queue_rows(batch.key)))

    def _deadline(self, batch: Batch) -> None:
        if batch.state != "open":
            return
        if self.inflight(batch.key) < batch.policy.max_inflight:
            self._flush(batch)
        else:
            batch.due = True  # the model is busy: keep filling until a batch of this key returns

    def _flush(self, batch: Batch) -> None:
        if batch.state != "open":
            return
        self._close_open(batch)
        live = batch.live
        if not live:
            batch.state = "done"
            return
        batch.state = "dispatched"
        batch.dispatched_at = self.clock()
        # The first member that can answer on its own if the merged call is refused (a text batch's
        # REST caller, not a gRPC one: docs/batching.md), else the first.
        batch.leader = next((m for m in live if getattr(m.payload, "answers_alone", True)), live[0])
        self._inflight.setdefault(batch.key, []).append(batch)
        self._on_flush(batch)
        batch.leader.future.set_result(Outcome("leader", batch, start=batch.leader.start))

    def _close_open(self, batch: Batch) -> None:
        for t in batch._timers:
            t.cancel()
        batch._timers.clear()
        if self._open.get(batch.key) is batch:
            del self._open[batch.key]
        if not batch.members:
            batch.state = "done"

    def _done(self, batch: Batch) -> None:
        batch.state = "done"
        flying = self._inflight.get(batch.key, [])
        if batch in flying:
            flying.remove(batch)
        if not flying:
            self._inflight.pop(batch.key, None)
        waiting = self._open.get(batch.key)
        # A batch held back while the key was busy goes as soon as the key frees up.
        if waiting is not None and (waiting.due or waiting.rows >= self._target(waiting)):
            self._flush(waiting)

    @staticmethod
    def _renumber(batch: Batch) -> None:
        start = 0
        for m in batch.members:
            m.start = start
            start += m.rows


def _observe_flush(batch: Batch) -> None:
    model = batch.key.model
    BATCH_SIZE.labels(model).observe(batch.rows)
    BATCH_MEMBERS.labels(model).observe(len(batch.members))
    delay = BATCH_QUEUE_DELAY.labels(model)
    for m in batch.members:
        delay.observe(max(0.0, batch.dispatched_at - m.joined))


def _observe_fallback(batch: Batch, members: int) -> None:
    BATCH_FALLBACKS.labels(batch.key.model).inc(members)


# ---------------------------------------------------------------- merging and splitting tensors


def merge_rows(segments: list[np.ndarray]) -> np.ndarray:
    """Member tensors (N_i x row shape) concatenated along N, in member order."""
    return segments[0] if len(segments) == 1 else np.concatenate(segments, axis=0)
