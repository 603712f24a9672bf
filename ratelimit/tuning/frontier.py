"""The rate/burst frontier of one key: for each rate, the smallest whole burst that keeps the
rejected share of requests at or under the target (and, optionally, every refusal's wait under a
limit), found by bisection over exact replays; then one point recommended from the curve."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from contracts.config.ratelimit import MAX_BURST

from ..bucket import MILLI, NANO, US, BucketParams
from .replay import count, zero_refusal_burst
from .traces import Series


@dataclass(frozen=True, slots=True)
class Point:
    """One rate of the sweep. `burst` is None when no burst up to MAX_BURST meets the target."""

    rate: float
    burst: int | None
    requests: int
    rejected: int
    max_wait_s: float | None  # longest wait a refusal was told; None: a request larger than the burst

    @property
    def share(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0


@dataclass(frozen=True, slots=True)
class Frontier:
    key: str
    requests: int
    total: float  # units
    mean_rate: float  # units per second over the trace's span
    peak_1s: float  # the most units in one whole second
    points: tuple[Point, ...]
    pick: Point | None
    how: str  # why this point


def allowed_refusals(n: int, target: float) -> int:
    return math.floor(target * n + 1e-9)


def _feasible(times: list[int], costs: list[int], params: BucketParams, allowed: int, wait_us: int) -> bool:
    o = count(times, costs, params, give_up=allowed, wait_limit_us=wait_us)
    return not o.stopped


def smallest_burst(series: Series, rate: float, target: float, max_wait_s: float | None = None) -> Point:
    """The smallest whole burst at `rate` whose replay refuses at most floor(target * n) requests
    (and tells no refusal to wait longer than `max_wait_s`). Bisection between 1 and the burst
    that refuses nothing (the largest backlog), so it assumes fewer refusals with a larger burst."""
    times, costs = series
    n = len(times)
    rate_milli = round(rate * MILLI)
    allowed = allowed_refusals(n, target)
    wait_us = -1 if max_wait_s is None else round(max_wait_s * US)
    hi = max(1, -(-zero_refusal_burst(times, costs, rate_milli) // NANO))
    if hi > MAX_BURST:
        hi = MAX_BURST
        if not _feasible(times, costs, BucketParams(rate_milli, hi * NANO), allowed, wait_us):
            o = count(times, costs, BucketParams(rate_milli, hi * NANO))
            return Point(rate, None, n, o.rejected, _wait_s(o.max_wait_us))
    lo = 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _feasible(times, costs, BucketParams(rate_milli, mid * NANO), allowed, wait_us):
            hi = mid
        else:
            lo = mid + 1
    o = count(times, costs, BucketParams(rate_milli, hi * NANO))
    return Point(rate, hi, n, o.rejected, _wait_s(o.max_wait_us))


def _wait_s(w: int) -> float | None:
    return None if w < 0 else w / US


def _round3(x: float) -> float:
    """Three significant digits, and never below the limiter's 0.001/s resolution."""
    if x <= 0.001:
        return 0.001
    return max(0.001, float(f"{x:.3g}"))


def demand_stats(series: Series) -> tuple[float, float, float]:
    """(total units, mean units/s over the span, the most units within one whole second)."""
    times, costs = series
    total = sum(costs) / NANO
    if not times:
        return 0.0, 0.0, 0.0
    span_s = (times[-1] - times[0]) / US
    per_s: dict[int, int] = {}
    for t, c in zip(times, costs):
        k = t // US
        per_s[k] = per_s.get(k, 0) + c
    peak = max(per_s.values()) / NANO
    return total, (total / span_s if span_s > 0 else peak), peak


def auto_rates(series: Series, n: int = 12) -> list[float]:
    """A geometric sweep from the mean demand rate to the busiest second's demand."""
    _, mean, peak = demand_stats(series)
    lo = max(0.001, mean)
    hi = max(peak, lo * 1.5)
    if n <= 1:
        return [_round3(lo)]
    out = sorted({_round3(lo * (hi / lo) ** (i / (n - 1))) for i in range(n)})
    return out


def knee(points: Sequence[Point]) -> Point | None:
    """The point farthest below the chord joining the sweep's ends (both axes scaled to 0..1):
    past it, more rate buys little burst. Ties go to the lower rate."""
    ok = [p for p in points if p.burst is not None]
    if not ok:
        return None
    if len(ok) < 3:
        return ok[0]
    r0, r1 = ok[0].rate, ok[-1].rate
    bs = [p.burst for p in ok if p.burst is not None]
    b0, b1 = min(bs), max(bs)
    if r1 == r0 or b1 == b0:
        return ok[0]

    def below(p: Point) -> float:
        assert p.burst is not None
        return 1 - (p.rate - r0) / (r1 - r0) - (p.burst - b0) / (b1 - b0)

    return max(ok, key=lambda p: (round(below(p), 12), -p.rate))


def under_cap(points: Sequence[Point], cap: float) -> Point | None:
    """The lowest rate whose burst stays at or under `cap`."""
    for p in points:
        if p.burst is not None and p.burst <= cap:
            return p
    return None


def sweep(key: str, series: Series, rates: Sequence[float], target: float, *, max_wait_s: float | None = None,
          max_burst: float | None = None) -> Frontier:
    """Every rate's smallest burst, and the recommended point: the lowest rate under `max_burst`
    when given, else the knee."""
    total, mean, peak = demand_stats(series)
    points = tuple(smallest_burst(series, r, target, max_wait_s) for r in sorted(set(rates)))
    if max_burst is not None:
        pick = under_cap(points, max_burst)
        how = f"lowest rate with burst <= {max_burst:g}" if pick else f"no rate swept keeps burst <= {max_burst:g}"
    else:
        pick = knee(points)
        how = "knee of the frontier" if pick else "no rate swept meets the target"
    return Frontier(key, len(series[0]), total, mean, peak, points, pick, how)
