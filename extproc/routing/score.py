"""The weighted score: each surviving deployment's terms, computed once, and the pick order.

Latency and cost are min-max normalised across the candidates of one decision (the fastest or
cheapest gets 1, the slowest or priciest 0); quality is the configured one; load is 1 - watermark.
The weighted sum is scaled down by the observed error rate.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from extproc.routing.decision import Candidate
from extproc.routing.feedback import ClusterStats
from extproc.routing.index import Entry
from extproc.routing.settings import Weights


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


# One deployment that passed every check: (entry, watermark, expected latency s, cost estimate,
# error rate, admitted as fast, latency term, cost term, score). A tuple: a decision may score
# a thousand of them and builds a Candidate only for the few it returns.
Scored = tuple[Entry, float, float, float, float, bool, float, float, float]


def score(
    admitted: list[tuple[Entry, float, bool]],
    stats: Mapping[str, ClusterStats],
    weights: Weights,
    *,
    stream: bool,
    prior_weight: float,
    prompt_tokens: int,
    output_tokens: int,
) -> list[Scored]:
    """Every term of every deployment, computed once, and its score."""
    lats: list[float] = []
    costs: list[float] = []
    errs: list[float] = []
    for e, _, _ in admitted:
        st = stats.get(e.cluster)
        lats.append(expected_latency(e, st, stream, prior_weight))
        costs.append(cost_estimate(e, prompt_tokens, output_tokens))
        errs.append(st.error_rate if st is not None else 0.0)
    wq, wl, wc, wload = weights.normalised()
    lat_lo, cost_lo = min(lats), min(costs)
    lat_span, cost_span = max(lats) - lat_lo, max(costs) - cost_lo
    out: list[Scored] = []
    for (e, wm, fast), lat, cost, err in zip(admitted, lats, costs, errs):
        # Min-max across the candidate set: the fastest / cheapest gets 1, the slowest 0.
        t_lat = 1.0 - (lat - lat_lo) / lat_span if lat_span > 0 else 1.0
        t_cost = 1.0 - (cost - cost_lo) / cost_span if cost_span > 0 else 1.0
        base = wq * e.quality + wl * t_lat + wc * t_cost + wload * (1.0 - wm)
        out.append((e, wm, lat, cost, err, fast, t_lat, t_cost, base * (1.0 - err)))
    return out


def pick(scored: list[Scored], limit: int) -> list[Scored]:
    """Best first, at most `limit` (0: all): admitted fast deployments first, then standard ones
    as failover; config order breaks ties so decisions are reproducible."""
    keys = [(not p[5], -p[8], i) for i, p in enumerate(scored)]
    top = heapq.nsmallest(limit, keys) if 0 < limit < len(keys) else sorted(keys)
    return [scored[i] for _, _, i in top]


def candidate(p: Scored) -> Candidate:
    e, wm, lat, cost, err, fast, t_lat, t_cost, total = p
    terms = {
        "quality": e.quality,
        "latency": t_lat,
        "cost": t_cost,
        "load": 1.0 - wm,
        "error_rate": err,
        "latency_s": lat,
        "cost_est": cost,
        "watermark": wm,
    }
    return Candidate(e.name, e.dep, e.channel, total, terms, e.model, fast)
