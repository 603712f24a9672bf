"""One key's requests against one bucket, replayed with the limiter's integer math.

`count` is the hot loop of the frontier: `bucket.settle` then `bucket.try_take`, inlined on plain
ints (no dataclass per request), so a replay of a million requests takes a fraction of a second.
It computes exactly what a loop of `bucket.try_take` computes (tests/ratelimit/test_tuning_replay.py
checks them against each other); `trajectory` is that loop, for plots. A bucket starts full at the
first request, as a fresh limiter bucket does.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import bucket
from ..bucket import BucketParams


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one replay refused: how many requests, and the longest wait a refusal was told
    (`retry-after` before rounding, us; -1 when some request can never pass: cost > burst).
    `stopped` is True when the replay quit early past `give_up` refusals (the counts are then
    lower bounds)."""

    rejected: int
    max_wait_us: int
    stopped: bool = False


def count(times: list[int], costs: list[int], params: BucketParams, give_up: int = -1,
          wait_limit_us: int = -1) -> Outcome:
    """Refusals of `times`/`costs` (sorted us, nano) at `params`. Stops once refusals exceed
    `give_up` or a wait exceeds `wait_limit_us` (when >= 0): the caller only needs to know that."""
    if not times:
        return Outcome(0, 0)
    rate, burst = params.rate_milli, params.burst_nano
    level, last = burst, times[0]
    rejected, worst = 0, 0
    for t, c in zip(times, costs):
        if t != last:  # settle: time only moves forward in a sorted trace
            level += rate * (t - last)
            last = t
            if level > burst:
                level = burst
        if level >= c:  # try_take
            level -= c
            continue
        rejected += 1
        w = bucket.wait_us(level, c, params)
        if worst >= 0 and (w < 0 or w > worst):
            worst = w
        if (0 <= give_up < rejected) or (wait_limit_us >= 0 and (w < 0 or w > wait_limit_us)):
            return Outcome(rejected, worst, True)
    return Outcome(rejected, worst)


def zero_refusal_burst(times: list[int], costs: list[int], rate_milli: int) -> int:
    """The smallest burst (nano) that refuses nothing at this rate: the largest backlog
    `d_i = max(0, d_{i-1} - rate * dt) + cost_i` (with no refusal the level is exactly burst - d)."""
    d, peak, last = 0, 0, times[0] if times else 0
    for t, c in zip(times, costs):
        d -= rate_milli * (t - last)
        last = t
        if d < 0:
            d = 0
        d += c
        if d > peak:
            peak = d
    return peak


def trajectory(times: list[int], costs: list[int], params: BucketParams) -> tuple[list[int], list[bool]]:
    """The bucket level (nano) right after each request, and whether it was admitted:
    `bucket.try_take` request by request."""
    if not times:
        return [], []
    st = bucket.full(params, times[0])
    levels, admitted = [], []
    for t, c in zip(times, costs):
        ok, st, _ = bucket.try_take(st, params, c, t)
        levels.append(st.level_nano)
        admitted.append(ok)
    return levels, admitted
