"""Token bucket math: pure, exact integer arithmetic, clocks passed in.

State is a level plus the time it was last settled. Every quantity is an integer so long runs
never drift:

- time in microseconds (`now_us`);
- levels and costs in nano-units (1 unit = 10**9 nano-units; a unit is one request or one token);
- rates in milli-units per second, so refilling over `dt` microseconds adds exactly
  `rate_milli * dt` nano-units (milli/s * us = 1e-3 * 1e-6 = 1e-9 units).

Admission needs `level >= cost`, so an admitted request never takes a bucket below zero. A
bucket's level goes negative only through `adjust` (reconciling an under-estimated token cost),
never below `-burst`: the debt makes later requests wait instead of being forgiven.
"""

from __future__ import annotations

from dataclasses import dataclass

NANO = 10**9  # nano-units per unit
MILLI = 1000  # milli-units per unit
US = 1_000_000  # microseconds per second


@dataclass(frozen=True, slots=True)
class BucketParams:
    """Rate in milli-units per second, burst (capacity) in nano-units."""

    rate_milli: int
    burst_nano: int

    @classmethod
    def of(cls, rate: float, burst: float) -> BucketParams:
        return cls(rate_milli=round(rate * MILLI), burst_nano=round(burst * NANO))


@dataclass(frozen=True, slots=True)
class BucketState:
    level_nano: int
    ts_us: int


def full(params: BucketParams, now_us: int) -> BucketState:
    return BucketState(params.burst_nano, now_us)


def settle(state: BucketState, params: BucketParams, now_us: int) -> BucketState:
    """Refill up to `now_us`; a clock that went backwards refills nothing."""
    dt = now_us - state.ts_us
    if dt <= 0:
        return BucketState(min(state.level_nano, params.burst_nano), state.ts_us)
    level = min(params.burst_nano, state.level_nano + params.rate_milli * dt)
    return BucketState(level, now_us)


def wait_us(level_nano: int, cost_nano: int, params: BucketParams) -> int:
    """Microseconds until `level` reaches `cost` (ceil); -1 when it never can (cost > burst)."""
    if cost_nano > params.burst_nano:
        return -1
    need = cost_nano - level_nano
    if need <= 0:
        return 0
    if params.rate_milli <= 0:
        return -1
    return -(-need // params.rate_milli)


def reset_us(level_nano: int, params: BucketParams) -> int:
    """Microseconds until the bucket is full again."""
    need = params.burst_nano - level_nano
    if need <= 0 or params.rate_milli <= 0:
        return 0
    return -(-need // params.rate_milli)


def try_take(
    state: BucketState, params: BucketParams, cost_nano: int, now_us: int
) -> tuple[bool, BucketState, int]:
    """One bucket's decision: (allowed, settled state after charging if allowed, wait_us)."""
    s = settle(state, params, now_us)
    if s.level_nano >= cost_nano:
        return True, BucketState(s.level_nano - cost_nano, s.ts_us), 0
    return False, s, wait_us(s.level_nano, cost_nano, params)


def adjust(state: BucketState, params: BucketParams, delta_nano: int, now_us: int) -> BucketState:
    """Return (delta > 0) or take (delta < 0) tokens after the fact; clamped to [-burst, burst]."""
    s = settle(state, params, now_us)
    level = max(-params.burst_nano, min(params.burst_nano, s.level_nano + delta_nano))
    return BucketState(level, s.ts_us)
