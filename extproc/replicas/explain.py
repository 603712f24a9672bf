"""The replica picks in `modelyard route explain`: for each ranked deployment with `replica_metrics`,
what the picker would choose now and each replica's score terms, replayed from the running
extproc's `/metrics` (`modelyard_replica_state`, `modelyard_replica_loras`) with `--live`.

The replay is the picker itself (`pick_replica`) over the same readings, in-flight counts and
failure holds; only prefix affinity is not replayed (the prompt's blocks live in the extproc's
own index), so its term reads 0 here.
"""

from __future__ import annotations

import sys
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from contracts.config import GatewayConfig
from extproc.replicas.picker import pick_replica
from extproc.replicas.readings import ReplicaReading
from extproc.routing.explain import explain_main as route_explain_main

Live = dict[tuple[str, str], tuple[dict[str, float], set[str]]]


def live_states(metrics_text: str) -> Live:
    """(cluster, endpoint) -> (field -> value, adapters loaded), from an extproc's /metrics text."""
    out: Live = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name not in ("modelyard_replica_state", "modelyard_replica_loras"):
            continue
        for sample in family.samples:
            key = (sample.labels.get("cluster", ""), sample.labels.get("endpoint", ""))
            fields, loras = out.setdefault(key, ({}, set()))
            if family.name == "modelyard_replica_state":
                fields[sample.labels.get("field", "")] = sample.value
            elif sample.value:
                loras.add(sample.labels.get("adapter", ""))
    return out


def replica_pick(config: GatewayConfig, cluster: str, model: str, live: Live, now: float) -> dict[str, Any] | None:
    """The picker's choice for one deployment, JSON-ready, with each replica's live fields; None
    when the deployment does not pick replicas."""
    d = config.clusters().get(cluster)
    if d is None or d.replica_metrics is None:
        return None
    s = d.replica_metrics
    readings: dict[str, ReplicaReading] = {}
    in_flight: dict[str, int] = {}
    failed_at: dict[str, float] = {}
    hold = s.failure_hold_ms / 1000.0
    for ep in d.endpoints:
        fields, loras = live.get((cluster, ep), ({}, set()))
        if "waiting" in fields and "running" in fields:
            max_lora = fields.get("max_lora")
            readings[ep] = ReplicaReading(fields["waiting"], fields["running"], fields.get("kv_usage"),
                                          now - fields.get("age_seconds", 0.0), frozenset(loras),
                                          None if max_lora is None else int(max_lora))
        if fields.get("in_flight"):
            in_flight[ep] = int(fields["in_flight"])
        if "held_seconds" in fields:
            failed_at[ep] = now - (hold - fields["held_seconds"])
    pick = pick_replica(s, list(d.endpoints), readings, in_flight, failed_at, now,
                        adapter=d.upstream_model or model)
    doc = pick.explain()
    if doc["weights"] is None:  # nothing fresh: the weights a pick would use
        doc["weights"] = s.weights.model_dump()
    for row in doc["ranked"]:
        fields = live.get((cluster, row["endpoint"]), ({}, set()))[0]
        row.update(waiting=fields.get("waiting"), running=fields.get("running"), in_flight=fields.get("in_flight", 0),
                   age_ms=round(fields["age_seconds"] * 1000) if "age_seconds" in fields else None,
                   held_s=fields.get("held_seconds"))
    return doc


def add_replica_picks(config: GatewayConfig, doc: dict[str, Any], metrics_text: str, now: float) -> None:
    """`route explain`'s addition: every ranked row whose deployment picks replicas gets its pick."""
    live = live_states(metrics_text)
    for row in doc["rows"]:
        if row["rank"] is None:
            continue
        pick = replica_pick(config, row["cluster"], row["model"], live, now)
        if pick is not None:
            row["replicas"] = pick


def explain_main(argv: list[str]) -> int:
    """`modelyard route explain`, with the replica picks."""
    return route_explain_main(argv, add_replica_picks)


if __name__ == "__main__":
    raise SystemExit(explain_main(sys.argv[1:]))
