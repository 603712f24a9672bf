"""`modelyard route explain`: every deployment a request could reach, why it was filtered, and
the score terms of the rest, for one request described on the command line."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from contracts.config import GatewayConfig, load_config
from contracts.config.queueing import TIERS
from contracts.config.service_levels import Tier
from contracts.errors import ConfigError
from contracts.watermarks import Reading
from extproc.routing.decision import Candidate, Rejection, RouteRequest
from extproc.routing.errors import NoCapacity, NoRoute
from extproc.routing.latency import LatencyState, from_exposition
from extproc.routing.scheduler import Scheduler


@dataclass
class QueueState:
    """One limited deployment's slots and queue: configured limits, and what is in flight and waiting."""

    max_inflight: int
    bound: Mapping[Tier, int]
    inflight: int = 0
    waiting: dict[Tier, int] = field(default_factory=lambda: dict.fromkeys(TIERS, 0))

    @property
    def occupancy(self) -> float:
        return (self.inflight + sum(self.waiting.values())) / self.max_inflight

    def outlook(self, tier: Tier) -> str:
        """What a new request of `tier` meets here now."""
        if self.inflight < self.max_inflight and not any(self.waiting.values()):
            return "a slot is free"
        if self.waiting[tier] >= self.bound[tier]:
            return f"refused: the {tier} queue is full (503)"
        ahead = sum(self.waiting[t] for t in TIERS[: TIERS.index(tier) + 1])
        return f"waits: {ahead} ahead of it in tiers up to {tier}"

    def to_json(self, tier: Tier) -> dict[str, Any]:
        return {"max_inflight": self.max_inflight, "inflight": self.inflight, "waiting": dict(self.waiting),
                "bound": dict(self.bound), "outlook": self.outlook(tier)}


def queue_states(config: GatewayConfig, metrics_text: str = "") -> dict[str, QueueState]:
    """Every limited deployment's queue, filled from an extproc's /metrics text when given."""
    out = {name: QueueState(d.max_inflight, d.queue.bound) for name, d in config.clusters().items() if d.max_inflight}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            st = out.get(sample.labels.get("cluster", ""))
            if st is None:
                continue
            if sample.name == "modelyard_inflight":
                st.inflight = int(sample.value)
            elif sample.name == "modelyard_queue_depth" and sample.labels.get("tier") in st.waiting:
                tier: Tier = sample.labels["tier"]  # type: ignore[assignment]
                st.waiting[tier] += int(sample.value)  # one series per model on a shared cluster
    return out


def hold_share_trips(scheduler: Scheduler, metrics_text: str) -> None:
    """The share breakers' members a running extproc has tripped (`modelyard_breaker_state{group="share:..."}` 1)
    are tripped in `scheduler` too, so the explain skips them as the extproc does."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "modelyard_breaker_state":
            for sample in family.samples:
                label = sample.labels.get("group", "")
                if label.startswith("share:") and sample.value == 1:
                    scheduler.shares.hold(label)


def latency_states(config: GatewayConfig, metrics_text: str) -> dict[str, LatencyState]:
    """Every deployment with an `slo:` as a running extproc measured it (`modelyard_latency_objective`
    in its /metrics; an empty text: nothing measured)."""
    fields: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "modelyard_latency_objective":
            for sample in family.samples:
                fields.setdefault(sample.labels.get("cluster", ""), {})[sample.labels.get("field", "")] = sample.value
    return from_exposition({c: d.slo for c, d in config.clusters().items() if d.slo is not None}, fields)


def explain(
    scheduler: Scheduler, req: RouteRequest, now: float, watermarks: Mapping[str, Reading],
    queues: Mapping[str, QueueState] | None = None, latency: Mapping[str, LatencyState] | None = None,
) -> dict[str, Any]:
    """A JSON-ready account of one decision (dry run: no trial quota is consumed); `queues` adds
    each limited deployment's slots and queue, read as load as the extproc does; `latency` each
    deployment's measured latency against its objective (default: as `scheduler` measured it)."""
    queues = queues or {}
    if latency is None:
        latency = dict(scheduler.latency.states(now))
    slow = {c: (st.objective.load, st.over) for c, st in latency.items() if st.over}
    rejected: tuple[Rejection, ...]
    candidates: tuple[Candidate, ...]
    out: dict[str, Any] = {
        "model": req.model,
        "tenant": req.tenant.name,
        "tier": req.tenant.tier,
        "want_fast": req.want_fast,
    }
    try:
        d = scheduler.decide(req, now, watermarks, dry_run=True,
                             occupancy={name: q.occupancy for name, q in queues.items()}, slow=slow)
    except NoRoute as e:
        retry_after_s = e.retry_after_s if isinstance(e, NoCapacity) else None
        out.update(status=e.status, error=e.message, retry_after_s=retry_after_s)
        rejected, candidates = e.rejected, ()
    else:
        out.update(
            status=200,
            strategy=d.strategy,
            arm=d.arm,
            weights=d.weights.terms(),
            tolerance=d.weights.tolerances(),
            channel=d.channel,
            downgraded=d.downgraded,
            chosen=d.chosen.cluster,
        )
        rejected, candidates = d.rejected, d.candidates
        if d.learned is not None:  # routing.adaptive: this explain's own draw, and every arm's share now
            out["adaptive"] = {"arm": d.learned.arm, "propensity": round(d.learned.propensity, 4),
                               "shares": {a: round(p, 4) for a, p in d.learned.shares.items()}}
        if d.chosen.cluster in queues:
            out["queue"] = queues[d.chosen.cluster].outlook(req.tenant.tier)
    rows: list[dict[str, Any]] = [
        {
            "rank": i + 1,
            "model": c.model,
            "cluster": c.cluster,
            "channel": c.channel,
            "score": round(c.score, 4),
            "terms": {k: round(v, 4) for k, v in c.terms.items()},
        }
        for i, c in enumerate(candidates)
    ]
    for r in rows:
        if r["cluster"] in queues:
            r["queue"] = queues[r["cluster"]].to_json(req.tenant.tier)
    rows += [
        {"rank": None, "model": r.model, "cluster": r.cluster, "filtered": r.reason}
        for r in rejected
    ]
    for r in rows:
        if r["cluster"] in latency:
            r["latency"] = latency[r["cluster"]].to_json()
    out["rows"] = rows
    return out


def format_explain(doc: Mapping[str, Any]) -> str:
    head = f"model={doc['model']} tenant={doc['tenant']} ({doc['tier']}) fast={doc['want_fast']}"
    if doc["status"] != 200:
        lines = [head, f"-> {doc['status']}: {doc['error']}"]
    else:
        w = doc["weights"]
        lines = [
            head,
            f"strategy={doc['strategy']} arm={doc['arm']} weights="
            + " ".join(f"{k}={v:g}" for k, v in w.items()),
            _tolerance_line(doc.get("tolerance")),
            f"-> {doc['chosen']} on the {doc['channel']} channel"
            + (" (fast not admitted: downgraded)" if doc["downgraded"] else "")
            + (f"; queue: {doc['queue']}" if doc.get("queue") else ""),
        ]
        if doc.get("adaptive"):
            a = doc["adaptive"]
            lines.append("learning strategy (routing.adaptive) shares now: "
                         + ", ".join(f"{k} {v:.2f}" for k, v in a["shares"].items())
                         + f"; this draw: {a['arm']} (p={a['propensity']:.2f})")
    lines.append("")
    lines.append(
        f"{'#':>2}  {'model':<16} {'cluster':<20} {'channel':<8} {'score':>6}  "
        f"{'qual':>5} {'lat':>5} {'cost':>5} {'load':>5} {'err':>5}  note"
    )
    for r in doc["rows"]:
        if r["rank"] is not None:
            t = r["terms"]
            lines.append(
                f"{r['rank']:>2}  {r['model']:<16} {r['cluster']:<20} {r['channel']:<8} "
                f"{r['score']:>6.3f}  {t['quality']:>5.2f} {t['latency']:>5.2f} {t['cost']:>5.2f} "
                f"{t['load']:>5.2f} {t['error_rate']:>5.2f}  "
                f"~{t['latency_s'] * 1000:.0f} ms, ~{t['cost_est']:.4f}/req"
            )
        else:
            lines.append(f"{'-':>2}  {r['model']:<16} {r['cluster']:<20} filtered: {r['filtered']}")
    timed = [r for r in doc["rows"] if r.get("latency")]
    if timed:
        lines += ["", "latency objectives (the gateway's own calls over the window):"]
        for r in timed:
            lines.append(f"    {r['cluster']:<20} {_latency_line(r['latency'])}")
    for r in doc["rows"]:
        if r.get("replicas"):
            lines += ["", *format_replicas(r["cluster"], r["replicas"])]
    queued = [r for r in doc["rows"] if r.get("queue")]
    if queued:
        lines += ["", "slots and queues (max_inflight):"]
        for r in queued:
            q = r["queue"]
            waiting = " ".join(f"{t}={n}/{q['bound'][t]}" for t, n in q["waiting"].items())
            lines.append(f"    {r['cluster']:<20} {q['inflight']}/{q['max_inflight']} in flight, waiting {waiting}: "
                         f"{q['outlook']}")
    return "\n".join(lines)


def _tolerance_line(tol: Mapping[str, float] | None) -> str:
    """How far apart latencies and costs must be to count in full (score.scaled)."""
    if not tol:
        return "latency and cost scaled min-max"
    return (f"latency scaled over max(spread, {tol['latency']:.0%} of the fastest, {tol['latency_ms']:g} ms); "
            f"cost over max(spread, {tol['cost']:.0%} of the cheapest)")


def format_replicas(cluster: str, p: Mapping[str, Any]) -> list[str]:
    """One deployment's replica pick (`extproc/replicas/explain.py` fills it): each replica's terms."""
    w = p.get("weights") or {}
    head = (f"replicas of {cluster} (weights " + " ".join(f"{k}={v:g}" for k, v in w.items()) + "): "
            + (f"-> {p['endpoint']} ({p['why']})" if p["endpoint"] else f"-> none picked ({p['why']}): Envoy balances"))
    lines = [head, f"    {'endpoint':<22} {'score':>6}  {'queue':>5} {'kv':>5} {'prefix':>6} {'lora':>5}  "
                   f"{'waiting':>7} {'running':>7} {'inflight':>8} {'age_ms':>6}  note"]
    for r in p["ranked"]:
        lines.append(f"    {r['endpoint']:<22} {r['score']:>6.3f}  {r['queue']:>5.2f} {r['kv_cache']:>5.2f} "
                     f"{r['prefix']:>6.2f} {r['lora']:>5.2f}  {_num(r.get('waiting')):>7} {_num(r.get('running')):>7} "
                     f"{_num(r.get('in_flight')):>8} {_num(r.get('age_ms')):>6}  "
                     + ("picked" if r["endpoint"] == p["endpoint"] else ""))
    for r in p["left_out"]:
        lines.append(f"    {r['endpoint']:<22} {'-':>6}  left out: {r['why']}")
    return lines


def _latency_line(t: Mapping[str, Any]) -> str:
    o = t["objective"]
    parts = [f"{name} {_num(t[name + '_ms'])} ms of {t[name + '_samples']} calls (objective {_num(o[name + '_ms'])} ms)"
             for name in ("p99", "ttft") if o[name + "_ms"] is not None]
    judged = any(t[name + "_samples"] >= t["min_samples"] for name in ("p99", "ttft") if o[name + "_ms"] is not None)
    verdict = (f"over: counts as load {t['load']:.2f}" if t["over"] else "within" if judged
               else f"not judged (fewer than {t['min_samples']} calls: fail open)")
    return ", ".join(parts) + f", window {t['window_s']:g} s: {verdict}"


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:g}"


# A hook that adds to an explained decision what another room of the extproc decides after routing
# (the replica picks: extproc/replicas/explain.py): (config, doc, the extproc's /metrics text, now).
Addition = Callable[[GatewayConfig, dict[str, Any], str, float], None]


def _live_metrics(config: GatewayConfig) -> str:
    """The running extproc's /metrics (its queues now); the CLI's cold path, so a plain blocking read."""
    url = f"http://{config.extproc.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=3) as resp:  # noqa: S310 (an address from our own config)
        return str(resp.read().decode("utf-8", "replace"))


def _watermark_arg(text: str) -> tuple[str, float]:
    cluster, sep, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not sep or not cluster or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected CLUSTER=VALUE with VALUE in [0, 1], got {text!r}")
    return cluster, v


def explain_main(argv: list[str], add: Addition | None = None) -> int:
    ap = argparse.ArgumentParser(prog="modelyard route explain", description=__doc__)
    ap.add_argument("--config", default=None, help="modelyard.yaml (default: $MODELYARD_CONFIG)")
    ap.add_argument("--model", default="auto", help="model or group name (default: auto)")
    ap.add_argument("--tenant", default=None, help="tenant name (default: the first tenant)")
    ap.add_argument("--strategy", default=None, help="override the tenant's strategy")
    ap.add_argument("--tools", action="store_true", help="the request uses tools")
    ap.add_argument("--vision", action="store_true", help="the request carries images")
    ap.add_argument("--stream", action="store_true", help="the request streams")
    ap.add_argument("--fast", action="store_true", help="ask for the fast channel")
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--output-tokens", type=int, default=None)
    ap.add_argument("--task-type", default="chat")
    ap.add_argument("--task-id", default="explain")
    ap.add_argument(
        "--watermark",
        action="append",
        type=_watermark_arg,
        default=[],
        metavar="CLUSTER=VALUE",
        help="a current watermark; monitored clusters not named are assumed at 0.0",
    )
    ap.add_argument("--live", action="store_true",
                    help="read the slots, queues and replica readings now from the running extproc's /metrics "
                         "(extproc.metrics_address)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    try:
        config = load_config(args.config)
        scheduler = Scheduler(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tenant = next((t for t in config.tenants if t.name == args.tenant), None)
    if args.tenant is None:
        tenant = config.tenants[0]
    if tenant is None:
        print(f"error: no tenant {args.tenant!r}", file=sys.stderr)
        return 2
    now = time.monotonic()
    given = dict(args.watermark)
    readings = {c: Reading(given.get(c, 0.0), now) for c in config.clusters()}
    req = RouteRequest(
        model=args.model,
        tenant=tenant,
        strategy_override=args.strategy,
        want_fast=args.fast,
        est_prompt_tokens=max(0, args.prompt_tokens),
        est_output_tokens=args.output_tokens,
        needs_tools=args.tools,
        needs_vision=args.vision,
        stream=args.stream,
        task_type=args.task_type,
        task_id=args.task_id,
    )
    metrics_text = ""
    if args.live:
        try:
            metrics_text = _live_metrics(config)
        except OSError as e:
            print(f"error: cannot read {config.extproc.metrics_address}/metrics: {e}", file=sys.stderr)
            return 2
    if metrics_text and scheduler.shares:
        hold_share_trips(scheduler, metrics_text)
    doc = explain(scheduler, req, now, readings, queue_states(config, metrics_text),
                  latency_states(config, metrics_text) if args.live else None)
    if add is not None:
        add(config, doc, metrics_text, now)
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_explain(doc))
    return 0 if doc["status"] == 200 else 1


if __name__ == "__main__":
    raise SystemExit(explain_main(sys.argv[1:]))
