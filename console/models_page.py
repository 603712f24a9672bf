"""The Models page, pure: each deployment's health, reading, queue, in-flight, error rate, p50/p99 and
TTFT now, and `modelyard route explain`'s account of a request typed into the form."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from console.html import ROOT, Safe, field, join, notice, select, table, tag

# One histogram's buckets: (upper bound, cumulative count), +Inf last.
Buckets = list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class DeploymentRow:
    model: str
    cluster: str
    protocol: str
    state: str  # cooldown, warming, or its slots' state
    reading: str  # the watermark, the replicas' readings, or "-"
    waiting: int | None
    inflight: int | None
    max_inflight: int | None
    requests: int
    error_rate: float
    p50_ms: float | None
    p99_ms: float | None
    ttft_ms: float | None


def quantile(buckets: Buckets, q: float) -> float | None:
    """Prometheus's histogram_quantile over cumulative buckets: linear inside the bucket that holds the
    q-th observation; None without observations; the highest finite bound when it falls in +Inf."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            inside = count - lower_count
            return lower_bound + (bound - lower_bound) * ((rank - lower_count) / inside if inside else 1.0)
        lower_bound, lower_count = bound, count
    return lower_bound


def histograms(samples: Iterable[tuple[str, Mapping[str, str], float]], name: str) -> dict[str, Buckets]:
    """`name`'s buckets per cluster (summed over models) from exposition samples (name, labels, value)."""
    per: dict[str, dict[float, float]] = {}
    for sample, labels, value in samples:
        if sample != f"{name}_bucket" or "cluster" not in labels:
            continue
        le = float(labels.get("le", "inf").replace("+Inf", "inf"))
        slot = per.setdefault(labels["cluster"], {})
        slot[le] = slot.get(le, 0.0) + value
    return {c: sorted(b.items()) for c, b in per.items()}


def replica_summary(replicas: Sequence[Mapping[str, float]]) -> str:
    """One deployment's replica readings (the picker's view: waiting, running, KV cache use, held after a
    failure) in a cell."""
    if not replicas:
        return "-"
    read = [r for r in replicas if "waiting" in r]
    parts = [f"{len(replicas)} replicas ({len(read)} read)"]
    if read:
        parts.append(f"waiting {sum(r['waiting'] for r in read):g}, running {sum(r['running'] for r in read):g}")
        kv = [r["kv_usage"] for r in read if "kv_usage" in r]
        if kv:
            parts.append(f"KV {max(kv):.0%} max")
    held = sum(1 for r in replicas if "held_seconds" in r)
    if held:
        parts.append(f"{held} held after a failure")
    return "; ".join(parts)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _ms_text(v: float | None) -> str:
    return "-" if v is None else f"{v:g} ms"


def render(rows: Sequence[DeploymentRow], *, tenants: Sequence[str], models: Sequence[str],
           query: Mapping[str, str], explained: Mapping[str, Any] | None, worker: str,
           error: str | None = None) -> Safe:
    body = [(r.model, tag("code", r.cluster), r.protocol,
             tag("span", r.state, class_="bad" if r.state in ("cooldown", "full") else "ok"), r.reading,
             "-" if r.waiting is None else r.waiting,
             "-" if r.inflight is None else f"{r.inflight} / {r.max_inflight}", r.requests, f"{r.error_rate:.1%}",
             _ms_text(r.p50_ms), _ms_text(r.p99_ms), _ms_text(r.ttft_ms)) for r in rows]
    parts = [tag("p", f"As {worker} sees them now (each worker keeps its own latency and error averages; "
                      "slots and queues are the host's).", class_="empty"),
             table(["model", "deployment", "protocol", "health", "reading", "queued", "in flight", "requests",
                    "error rate", "p50", "p99", "TTFT"], body, id_="deployments"),
             tag("h2", "Why would it go there? (route explain)"),
             tag("form", [
                 select("model", "model", ["auto", *models], query.get("model", "auto")),
                 select("tenant", "tenant", tenants, query.get("tenant", tenants[0] if tenants else "")),
                 field("prompt tokens", "prompt_tokens", value=query.get("prompt_tokens", "0"), type_="number"),
                 field("output tokens", "output_tokens", value=query.get("output_tokens", ""), type_="number"),
                 select("stream", "stream", ["no", "yes"], query.get("stream", "no")),
                 select("fast channel", "fast", ["no", "yes"], query.get("fast", "no")),
                 select("tools", "tools", ["no", "yes"], query.get("tools", "no")),
                 Safe('<button type="submit" name="explain" value="1">Explain</button>'),
             ], method="get", action=f"{ROOT}/models", id="explain-form"),
             notice(error, "bad")]
    if explained is not None:
        parts.append(explain_block(explained))
    return join(parts)


def explain_block(doc: Mapping[str, Any]) -> Safe:
    if doc.get("status") == 200:
        head = tag("p", ["→ ", tag("strong", doc.get("chosen", "")), f" (strategy {doc.get('strategy')}, channel "
                         f"{doc.get('channel')}" + (f", {doc['queue']}" if doc.get("queue") else "") + ")"],
                   class_="notice", id="explain-verdict")
    else:
        head = tag("p", f"→ {doc.get('status')}: {doc.get('error')}", class_="notice bad", id="explain-verdict")
    rows = []
    for r in doc.get("rows", []):
        why = r.get("filtered") or ", ".join(f"{k} {v}" for k, v in (r.get("terms") or {}).items())
        lat = r.get("latency") or {}
        rows.append((r.get("rank") or "-", r.get("model", ""), tag("code", r.get("cluster", "")), r.get("channel", ""),
                     r.get("score", ""), why, _ms_text(lat.get("p99_ms")) if lat else "-",
                     (r.get("replicas") or {}).get("pick", "") if isinstance(r.get("replicas"), dict) else ""))
    return join([head, table(["rank", "model", "deployment", "channel", "score", "terms or why filtered",
                              "p99 vs objective", "replica"], rows, id_="explain")])
