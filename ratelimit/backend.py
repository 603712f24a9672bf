"""What a bucket store answers, and the in-memory store (the embedded default)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from . import bucket
from .bucket import BucketParams, BucketState
from .rules import Charge


@dataclass(frozen=True, slots=True)
class BucketView:
    """One bucket right after a decision: level (nano), params, wait for this cost (us, -1 never)."""

    charge: Charge
    level_nano: int
    wait_us: int

    @property
    def params(self) -> BucketParams:
        return self.charge.params


@dataclass(frozen=True, slots=True)
class TakeResult:
    allowed: bool
    views: tuple[BucketView, ...]


class BucketStore(Protocol):
    async def take(self, charges: Sequence[Charge]) -> TakeResult: ...
    async def adjust(self, items: Sequence[tuple[Charge, int]]) -> None: ...
    async def close(self) -> None: ...


def monotonic_us() -> int:
    return time.monotonic_ns() // 1000


class MemoryBuckets:
    """Buckets in a dict; decisions are synchronous and atomic (no await inside)."""

    def __init__(self, clock: Callable[[], int] = monotonic_us) -> None:
        self._clock = clock
        self._state: dict[str, BucketState] = {}

    def take_now(self, charges: Sequence[Charge], now_us: int | None = None) -> TakeResult:
        now = self._clock() if now_us is None else now_us
        settled: list[BucketState] = []
        allowed = True
        for c in charges:
            st = self._state.get(c.key)
            s = bucket.full(c.params, now) if st is None else bucket.settle(st, c.params, now)
            settled.append(s)
            if s.level_nano < c.cost_nano:
                allowed = False
        views = []
        for c, s in zip(charges, settled):
            if allowed:
                s = BucketState(s.level_nano - c.cost_nano, s.ts_us)
                views.append(BucketView(c, s.level_nano, 0))
            else:
                views.append(BucketView(c, s.level_nano, bucket.wait_us(s.level_nano, c.cost_nano, c.params)))
            self._state[c.key] = s
        return TakeResult(allowed, tuple(views))

    def adjust_now(self, items: Sequence[tuple[Charge, int]], now_us: int | None = None) -> None:
        now = self._clock() if now_us is None else now_us
        for c, delta in items:
            st = self._state.get(c.key) or bucket.full(c.params, now)
            self._state[c.key] = bucket.adjust(st, c.params, delta, now)

    def level(self, key: str) -> BucketState | None:
        return self._state.get(key)

    async def take(self, charges: Sequence[Charge]) -> TakeResult:
        return self.take_now(charges)

    async def adjust(self, items: Sequence[tuple[Charge, int]]) -> None:
        self.adjust_now(items)

    async def close(self) -> None:
        self._state.clear()
