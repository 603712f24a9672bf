"""`modelyard route explain`: every deployment a request could reach, why it was filtered, and
the score terms of the rest, for one request described on the command line."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

import orjson

from extproc.config import load_config
from extproc.routing.decision import Candidate, Rejection, RouteRequest
from extproc.routing.errors import NoCapacity, NoRoute
from extproc.routing.scheduler import Scheduler
from extproc.routing.watermarks import Reading
from modelyard.errors import ConfigError


def explain(
    scheduler: Scheduler, req: RouteRequest, now: float, watermarks: Mapping[str, Reading]
) -> dict[str, Any]:
    """A JSON-ready account of one decision (dry run: no trial quota is consumed)."""
    rejected: tuple[Rejection, ...]
    candidates: tuple[Candidate, ...]
    out: dict[str, Any] = {
        "model": req.model,
        "tenant": req.tenant.name,
        "tier": req.tenant.tier,
        "want_fast": req.want_fast,
    }
    try:
        d = scheduler.decide(req, now, watermarks, dry_run=True)
    except NoRoute as e:
        retry_after_s = e.retry_after_s if isinstance(e, NoCapacity) else None
        out.update(status=e.status, error=e.message, retry_after_s=retry_after_s)
        rejected, candidates = e.rejected, ()
    else:
        out.update(
            status=200,
            strategy=d.strategy,
            arm=d.arm,
            weights=d.weights.model_dump(),
            channel=d.channel,
            downgraded=d.downgraded,
            chosen=d.chosen.cluster,
        )
        rejected, candidates = d.rejected, d.candidates
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
    rows += [
        {"rank": None, "model": r.model, "cluster": r.cluster, "filtered": r.reason}
        for r in rejected
    ]
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
            f"-> {doc['chosen']} on the {doc['channel']} channel"
            + (" (fast not admitted: downgraded)" if doc["downgraded"] else ""),
        ]
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
    return "\n".join(lines)


def _watermark_arg(text: str) -> tuple[str, float]:
    cluster, sep, value = text.partition("=")
    try:
        v = float(value)
    except ValueError:
        v = -1.0
    if not sep or not cluster or not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected CLUSTER=VALUE with VALUE in [0, 1], got {text!r}")
    return cluster, v


def explain_main(argv: list[str]) -> int:
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
    doc = explain(scheduler, req, now, readings)
    if args.json:
        sys.stdout.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print(format_explain(doc))
    return 0 if doc["status"] == 200 else 1


if __name__ == "__main__":
    raise SystemExit(explain_main(sys.argv[1:]))
