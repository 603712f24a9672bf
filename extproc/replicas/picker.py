"""The replica picker: per request, a score over each endpoint's fresh reading; pure.

score = (wq * queue + wkv * kv_headroom + wl * lora + wp * prefix) / (wq + wkv + wl + wp), with
  queue       1 / (1 + (waiting + running + in_flight) / queue_scale), in-flight being the
              gateway's own calls to it now, which move between scrapes (at saturation the term
              goes flat and prefix affinity decides: that keeps a system prompt's KV blocks shared
              on few replicas, which bench_replicas showed is the throughput there; counting queues
              from the shortest one instead spread them and lost: docs/routing.md);
  kv_headroom 1 - kv_usage (1 where the server does not report it);
  lora        1 adapter loaded, 0.5 a free adapter slot, 0 none (the term is left out where the
              request names no adapter the fleet reports);
  prefix      the share of the prompt's leading blocks last sent to this replica; 0 on a replica
              more than `balance_gap` calls behind the shortest fresh queue (a hot prefix's guard);
              with `load_bound`, only replicas within the bounded load keep it (bounded.py).
No fresh reading anywhere: no pick, and Envoy's own balancer chooses (fail open). A replica whose
last call failed is left out for `failure_hold_s` unless no other one is fresh.

`Pick.why` says in one word what decided (the audit row's `reason`): the term that put the pick
furthest ahead of the runner-up (`queue`, `kv_cache`, `prefix`, `lora`), `tie` (equal scores: config
order), `only` (one replica fresh and not held off), or `stale` (none fresh: Envoy balanced).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.config.balancing import ReplicaMetrics
from extproc.replicas.bounded import bounded_affinity
from extproc.replicas.readings import ReplicaReading


@dataclass(frozen=True, slots=True)
class ReplicaScore:
    endpoint: str
    score: float
    queue: float  # waiting + running + in-flight
    terms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Pick:
    """`endpoint` None: nothing fresh, Envoy balances; `reason` says why either way."""

    endpoint: str | None
    reason: str
    ranked: tuple[ReplicaScore, ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()  # (endpoint, why)
    why: str = "stale"  # one word: queue | kv_cache | prefix | lora | tie | only | stale
    weights: dict[str, float] | None = None  # the weights in force (terms a request cannot use: 0)

    def audit(self) -> dict[str, object]:
        """The audit row's `detail`: which replica and why, or that Envoy balanced."""
        if self.endpoint is None:
            return {"replica": None, "reason": self.why, "fallback": "envoy"}
        return {"replica": self.endpoint, "reason": self.why, "score": round(self.ranked[0].score, 4)}

    def explain(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "reason": self.reason, "why": self.why, "weights": self.weights,
                "ranked": [{"endpoint": s.endpoint, "score": round(s.score, 4), "queue_len": s.queue,
                            **{k: round(v, 4) for k, v in s.terms.items()}} for s in self.ranked],
                "left_out": [{"endpoint": e, "why": w} for e, w in self.left_out]}


def pick_replica(settings: ReplicaMetrics, endpoints: list[str], readings: Mapping[str, ReplicaReading],
                 in_flight: Mapping[str, int], failed_at: Mapping[str, float], now: float, *,
                 adapter: str | None = None, prefix_depth: Mapping[str, int] | None = None,
                 prefix_blocks: int = 0, prefix_key: bytes = b"") -> Pick:
    stale_after = settings.stale_after_s
    fresh: list[str] = []
    left_out: list[tuple[str, str]] = []
    for ep in endpoints:
        r = readings.get(ep)
        if r is None:
            left_out.append((ep, "no reading"))
        elif now - r.at > stale_after:
            left_out.append((ep, f"stale reading ({now - r.at:.3f}s old)"))
        else:
            fresh.append(ep)
    if not fresh:
        return Pick(None, "no fresh reading: Envoy balances", left_out=tuple(left_out))
    hold = settings.failure_hold_ms / 1000.0
    held = [ep for ep in fresh if now - failed_at.get(ep, -1e18) < hold]
    if held and len(held) < len(fresh):
        fresh = [ep for ep in fresh if ep not in held]
        left_out += [(ep, "failed its last call") for ep in held]
    w = settings.weights
    use_lora = adapter is not None and any(readings[ep].max_lora is not None for ep in fresh)
    weights = {"queue": w.queue, "kv_cache": w.kv_cache, "prefix": w.prefix if prefix_blocks else 0.0,
               "lora": w.lora if use_lora else 0.0}
    total = sum(weights.values()) or 1.0
    depth = prefix_depth or {}
    queues = {ep: readings[ep].waiting + readings[ep].running + in_flight.get(ep, 0) for ep in fresh}
    hot = min(queues.values()) + settings.balance_gap if settings.balance_gap is not None else float("inf")
    if settings.load_bound is not None and depth:
        depth = bounded_affinity(depth, queues, prefix_key, settings.load_bound, settings.queue_scale)
    scored = []
    for ep in fresh:
        r = readings[ep]
        queue = queues[ep]
        terms = {"queue": 1.0 / (1.0 + queue / settings.queue_scale),
                 "kv_cache": 1.0 - r.kv_usage if r.kv_usage is not None else 1.0,
                 "prefix": depth.get(ep, 0) / prefix_blocks if prefix_blocks and queue <= hot else 0.0,
                 "lora": _lora_term(r, adapter) if use_lora else 0.0}
        score = sum(weights[k] * v for k, v in terms.items()) / total
        scored.append(ReplicaScore(ep, score, queue, terms))
    # Best first; ties in config order, so the same readings give the same pick.
    order = {ep: i for i, ep in enumerate(endpoints)}
    scored.sort(key=lambda s: (-s.score, order[s.endpoint]))
    best = scored[0]
    why = ", ".join(f"{k} {v:.2f}" for k, v in best.terms.items() if weights[k])
    return Pick(best.endpoint, f"best score {best.score:.3f} ({why}; queue {best.queue:g})",
                tuple(scored), tuple(left_out), _decided_by(scored, weights), weights)


def _decided_by(scored: list[ReplicaScore], weights: dict[str, float]) -> str:
    """The term whose weighted lead over the runner-up is largest; `tie` when nothing leads."""
    if len(scored) == 1:
        return "only"
    best, second = scored[0], scored[1]
    lead = {k: w * (best.terms[k] - second.terms[k]) for k, w in weights.items() if w}
    term = max(lead, key=lambda k: lead[k], default="")
    return term if term and lead[term] > 1e-12 else "tie"


def _lora_term(r: ReplicaReading, adapter: str | None) -> float:
    if adapter in r.loras:
        return 1.0
    if r.max_lora is not None and len(r.loras) < r.max_lora:
        return 0.5
    return 0.0
