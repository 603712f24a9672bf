"""The weighted score: each surviving deployment's terms, computed once, and the pick order.

Latency and cost are scaled against the best candidate of one decision: the fastest (cheapest)
gets 1, and one `spread` slower (dearer) gets 0, where spread = max(max - min, tolerance * min,
floor). Between candidates far apart that is min-max; between near-equal ones ("twins") a few ms of
noise stay a small term, so load decides. Quality is the configured one; load is 1 - watermark.
The weighted sum is scaled down by the observed error rate.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from contracts.config.routing import Weights
from extproc.routing.decision import Candidate
from extproc.routing.feedback import ClusterStats, StatsLookup
from extproc.routing.index import Entry


def expected_latency(e: Entry, stats: ClusterStats | None, stream: bool, prior_weight: float) -> float:
    """Seconds: the configured latency blended with observations (time to first token when
    streaming), the configured value counting as `prior_weight` samples."""
    lat = e.prior_latency_s
    if stats is None:
        return lat
    k = prior_weight
    if stream and stats.ttft_n:
        return (lat * k + stats.ttft_s * stats.ttft_n) / (k + stats.ttft_n)
    if stats.latency_n:
        return (lat * k + stats.latency_s * stats.latency_n) / (k + stats.latency_n)
    return lat


def cost_estimate(e: Entry, prompt_tokens: int, output_tokens: int) -> float:
    return (prompt_tokens * e.cost_in + output_tokens * e.cost_out) / 1000.0


def scaled(values: list[float], tolerance: float, floor: float) -> tuple[list[float], float]:
    """Each value's term in [0, 1], lower values better, and the spread it was scaled by: the best
    gets 1, one spread worse 0. The spread is at least `tolerance` times the best value and at least
    `floor`, so differences within noise stay small; 0 when every value is equal and both are 0."""
    lo = min(values)
    spread = max(max(values) - lo, tolerance * lo, floor)
    if spread <= 0:
        return [1.0] * len(values), 0.0
    return [1.0 - (x - lo) / spread for x in values], spread


@dataclass(slots=True)
class Scores:
    """Every term of every deployment that passed the checks, computed once, index-aligned with
    `admitted`. Lists, not objects: a decision may score a thousand deployments and builds a
    Candidate only for the few it returns."""

    admitted: list[tuple[Entry, float, bool]]  # (entry, watermark, admitted as fast)
    latency_s: list[float]
    cost_est: list[float]
    error_rate: list[float]
    latency: list[float]
    cost: list[float]
    score: list[float]

    def candidate(self, i: int) -> Candidate:
        e, wm, fast = self.admitted[i]
        terms = {
            "quality": e.quality,
            "latency": self.latency[i],
            "cost": self.cost[i],
            "load": 1.0 - wm,
            "error_rate": self.error_rate[i],
            "latency_s": self.latency_s[i],
            "cost_est": self.cost_est[i],
            "watermark": wm,
        }
        return Candidate(e.name, e.dep, e.channel, self.score[i], terms, e.model, fast)


def score(
    admitted: list[tuple[Entry, float, bool]],
    stats: StatsLookup,
    weights: Weights,
    *,
    stream: bool,
    prior_weight: float,
    prompt_tokens: int,
    output_tokens: int,
) -> Scores:
    """Every term of every deployment, computed once, and its score."""
    sts = [stats.get(e.cluster) for e, _, _ in admitted]
    lats = [expected_latency(e, st, stream, prior_weight) for (e, _, _), st in zip(admitted, sts)]
    costs = [cost_estimate(e, prompt_tokens, output_tokens) for e, _, _ in admitted]
    errs = [st.error_rate if st is not None else 0.0 for st in sts]
    t_lat, _ = scaled(lats, weights.latency_tolerance, weights.latency_tolerance_ms / 1000.0)
    t_cost, _ = scaled(costs, weights.cost_tolerance, 0.0)
    wq, wl, wc, wload = weights.normalised()
    scores = [
        (wq * e.quality + wl * tl + wc * tc + wload * (1.0 - wm)) * (1.0 - err)
        for (e, wm, _), tl, tc, err in zip(admitted, t_lat, t_cost, errs)
    ]
    return Scores(admitted, lats, costs, errs, t_lat, t_cost, scores)


def pick(scores: Scores, limit: int, idle_spot: Callable[[Entry], bool] | None = None) -> list[int]:
    """Indices, best first, at most `limit` (0: all): admitted fast deployments first, then
    standard ones as failover; config order breaks ties so decisions are reproducible.
    `idle_spot` (a spot-first strategy): idle spot deployments go before the rest of their channel."""
    keys = [(not fast, not (idle_spot is not None and idle_spot(e)), -total, i)
            for i, ((e, _, fast), total) in enumerate(zip(scores.admitted, scores.score))]
    top = heapq.nsmallest(limit, keys) if 0 < limit < len(keys) else sorted(keys)
    return [k[-1] for k in top]
