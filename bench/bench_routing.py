"""Cost of one routing decision (filter + score + sort) against a trivial first-deployment pick.

Synthetic configs with 10 and 1,000 deployments. Cases: `group` routes `auto` across every
deployment (the worst case: all of them are scored), `model` routes one concrete model of the
large config (the index makes its cost independent of the config's size); `model-slo` is that case
with a latency objective on every deployment (`slo:`, 200 measured answers each in the window): its
cost over `model` is what latency in admission adds to a decision. `model-adaptive` routes the same
model with the learning strategy (routing.adaptive) on its cached shares, `model-adaptive-draw`
recomputing them (256 posterior draws per arm) for every decision: their cost over `model` is what
the bandit adds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smoke import scaled  # noqa: E402
from contracts.config import GatewayConfig, parse_config  # noqa: E402
from contracts.watermarks import Reading  # noqa: E402
from extproc.routing import RouteRequest, Scheduler  # noqa: E402

DEPLOYMENTS_PER_MODEL = 4


def synthetic(n_deployments: int, slo: bool = False, adaptive: dict | None = None) -> GatewayConfig:
    models = []
    n_models = max(1, n_deployments // DEPLOYMENTS_PER_MODEL)
    for m in range(n_models):
        per = min(DEPLOYMENTS_PER_MODEL, n_deployments - m * DEPLOYMENTS_PER_MODEL)
        deps = [
            {
                "cluster": f"m{m}-d{d}",
                "protocol": "openai",
                "channel": "fast" if d == 0 else "standard",
                "endpoints": ["127.0.0.1:9"],
                "watermark": {"url": f"http://127.0.0.1:9/{m}/{d}"},
                **({"slo": {"p99_ms": 500, "ttft_ms": 300, "window_s": 3600}} if slo else {}),
            }
            for d in range(per)
        ]
        models.append(
            {
                "name": f"model-{m}",
                "groups": ["auto"],
                "quality": (m % 10) / 10,
                "latency_ms": 100 + (m * 37) % 900,
                "cost": {"input_per_1k": (m % 7) * 0.5, "output_per_1k": (m % 5) * 2.0},
                "capabilities": {"context_window": 8192 * (1 + m % 4), "tools": m % 3 != 0},
                "deployments": deps,
            }
        )
    tenants = [{"name": "t", "tier": "L2", "api_keys": ["0" * 64]}]
    return parse_config({"models": models, "tenants": tenants, "routing": {"adaptive": adaptive or {}}})


def _median_us(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - t0)
    return statistics.median(samples) / 1000.0


def main() -> int:
    rows = []
    print(f"{'case':<22} {'deployments':>11} {'decide us':>10} {'baseline us':>12} {'ratio':>7}")
    for n, case, model, reps in [
        (10, "group", "auto", scaled(5000, 50)),
        (1000, "group", "auto", scaled(300, 5)),
        (1000, "model", "model-17", scaled(5000, 50)),
        (1000, "model-slo", "model-17", scaled(5000, 50)),
        # the learning strategy over model-17's standard deployments: shares cached (the default
        # refresh_s, every decision here in one instant) and recomputed for every decision (refresh_s 0)
        (1000, "model-adaptive", "model-17", scaled(5000, 50)),
        (1000, "model-adaptive-draw", "model-17", scaled(2000, 20)),
    ]:
        adaptive = ({"models": [model], "refresh_s": 0 if case.endswith("-draw") else 0.1}
                    if "adaptive" in case else None)
        cfg = synthetic(n, slo=case.endswith("-slo"), adaptive=adaptive)
        sched = Scheduler(cfg)
        tenant = cfg.tenants[0]
        marks = {c: Reading((i % 9) / 10, 1e9) for i, c in enumerate(cfg.clusters())}
        req = RouteRequest(model, tenant, est_prompt_tokens=2000, needs_tools=True, task_id="x")
        for i, c in enumerate(list(cfg.clusters())[:50]):
            sched.record(c, 0.1 + i / 100, i % 5 != 0, now=1e9)
        for c in [d.cluster for m in cfg.models if m.name == model for d in m.deployments]:
            for i in range(200):  # a full window to judge (ignored where no deployment has an slo)
                sched.record(c, 0.2 + (i % 10) / 100, True, now=1e9 - 200 + i)
        by_name = {m.name: m for m in cfg.models}

        # Default arguments bind this round's values (the closures are timed within the round).
        def trivial(by_name=by_name, model=model, cfg=cfg) -> str:
            # The baseline: a dict lookup and the first deployment of the first model.
            m = by_name.get(model) or cfg.models[0]
            return m.deployments[0].cluster

        def decide(sched=sched, req=req, marks=marks) -> str:
            return sched.decide(req, 1e9, marks).chosen.cluster

        decide(), trivial()
        d_us = _median_us(decide, reps)
        b_us = _median_us(trivial, reps)
        name = f"{case}-{n}"
        print(f"{name:<22} {n:>11} {d_us:>10.1f} {b_us:>12.2f} {d_us / b_us:>7.0f}x")
        rows.append(
            {
                "bench": "routing",
                "case": name,
                "metric": "decide_median",
                "value": round(d_us, 2),
                "unit": "us",
                "baseline": round(b_us, 3),
                "ratio": round(d_us / b_us, 1),
            }
        )
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
