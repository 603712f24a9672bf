"""An independent model of the limiter for the tuner's tests: exact rationals, no shared code.

A bucket is (level, last time) in Fractions of a unit and a second; a decision refills every
bucket of the request, admits when all hold its cost, and charges all or none. A refusal is bound
by the bucket with the longest wait (first such in the order buckets are listed); a cost above a
bucket's burst binds at once.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction as F

SCOPES = ("tenant", "tier", "cluster", "channel", "global")


class Bucket:
    def __init__(self, rate: F, burst: F, t: F):
        self.rate, self.burst, self.level, self.t = rate, burst, burst, t

    def refill(self, t: F) -> None:
        if t > self.t:
            self.level = min(self.burst, self.level + self.rate * (t - self.t))
            self.t = t

    def wait(self, cost: F) -> F | None:
        if cost > self.burst:
            return None
        # the limiter tells waits in whole microseconds, rounded up
        return F(math.ceil(max(F(0), (cost - self.level) / self.rate) * 1_000_000))


def refusals(times_s: list[F], costs: list[F], rate: F, burst: F) -> int:
    if not times_s:
        return 0
    b, n = Bucket(rate, burst, times_s[0]), 0
    for t, c in zip(times_s, costs):
        b.refill(t)
        if b.level >= c:
            b.level -= c
        else:
            n += 1
    return n


def smallest_burst_scan(times_s: list[F], costs: list[F], rate: F, target: float, start: int = 1,
                        limit: int = 10_000_000) -> int:
    """Linear scan from `start`: the first whole burst whose refusals fit the target."""
    allowed = int(target * len(times_s) + 1e-9)
    for b in range(max(1, start), limit):
        if refusals(times_s, costs, rate, F(b)) <= allowed:
            return b
    raise AssertionError("no burst found")


def _rule(limits: list[dict], scope: str, value: str, unit: str, tier: str | None) -> dict | None:
    def find(pred):
        return next((r for r in limits if r["scope"] == scope and r.get("unit", "requests") == unit and pred(r)), None)
    exact = find(lambda r: r.get("match", "*") == value and r.get("match", "*") != "*" and r.get("tier") is None)
    if exact:
        return exact
    if scope == "tenant" and tier is not None:
        by_tier = find(lambda r: r.get("tier") == tier)
        if by_tier:
            return by_tier
    return find(lambda r: r.get("match", "*") == "*" and r.get("tier") is None)


def label(r: dict) -> str:
    tier = f"[tier={r['tier']}]" if r.get("tier") else ""
    return f"{r['scope']}:{r.get('match', '*')}{tier}:{r.get('unit', 'requests')}"


def whatif(rows: list[dict], limits: list[dict], group_by: str) -> tuple[Counter, Counter, Counter]:
    """(requests per group, refusals per group, refusals per binding rule label)."""
    buckets: dict[tuple, Bucket] = {}
    reqs, refused, bound = Counter(), Counter(), Counter()
    units = {r.get("unit", "requests") for r in limits}
    for row in sorted(rows, key=lambda r: F(str(r["timestamp"]))):
        t = F(str(row["timestamp"]))
        g = "*" if group_by == "global" else row[group_by]
        reqs[g] += 1
        todo = []
        for unit in ("requests", "tokens"):
            if unit not in units:
                continue
            cost = F(1) if unit == "requests" else F(row["tokens"])
            for scope in SCOPES:
                value = "*" if scope == "global" else row[scope]
                r = _rule(limits, scope, value, unit, row["tier"])
                if r is None:
                    continue
                k = (scope, value, unit)
                b = buckets.get(k)
                if b is None:
                    b = buckets[k] = Bucket(F(str(r["rate"])), F(str(r["burst"])), t)
                b.refill(t)
                todo.append((b, cost, r))
        if all(b.level >= c for b, c, _ in todo):
            for b, c, _ in todo:
                b.level -= c
            continue
        refused[g] += 1
        worst, worst_wait = None, F(0)
        for b, c, r in todo:
            w = b.wait(c)
            if w is None:
                worst = r
                break
            if w > 0 and (worst is None or w > worst_wait):
                worst, worst_wait = r, w
        bound[label(worst)] += 1
    return reqs, refused, bound
