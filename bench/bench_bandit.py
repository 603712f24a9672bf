"""The learning strategy (routing.adaptive) on a replayed trace: its regret against the best fixed
deployment, beside the current scheduler (score + EWMA feedback + cooldowns), uniform, and the
bandit without forgetting; and the cost of a decision with and without it.

The trace (seeded, full information: every deployment's outcome for every call is drawn up front,
so each policy replays the same world): three deployments of one model, 20 calls a second. `a` is
the best (97% answered, 80 ms) for the first third, then degrades (60%, 400 ms), then heals; `b`
is steady (93%, 150 ms), `c` steady and slow (90%, 300 ms). Reward as shipped: success 1 and latency
1 against a 100 ms target; a failure is 0. Regret: the best fixed arm's mean reward in hindsight
minus the policy's (per call; lower is better, negative beats every fixed choice), mean and standard
deviation over 8 seeded traces.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.smoke import scaled  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from contracts.config.routing import RewardWeights  # noqa: E402
from extproc.routing import RouteRequest, Scheduler  # noqa: E402
from extproc.routing.bandit import call_reward  # noqa: E402

CALLS = scaled(6000, 600)
DT = 0.05
ARMS = ("a", "b", "c")
WEIGHTS = RewardWeights(success=1, latency=1, cost=0, feedback=0)
TARGET_MS = 100.0


def world(t: int, n: int) -> dict[str, tuple[float, float]]:
    """(success probability, latency s) per arm at call t of n."""
    a = (0.6, 0.4) if n // 3 <= t < 2 * n // 3 else (0.97, 0.08)
    return {"a": a, "b": (0.93, 0.15), "c": (0.9, 0.3)}


def trace(n: int, seed: int) -> list[dict[str, tuple[bool, float]]]:
    rng = random.Random(seed)
    out = []
    for t in range(n):
        row = {}
        for arm, (p, lat) in world(t, n).items():
            row[arm] = (rng.random() < p, lat * rng.uniform(0.8, 1.25))
        out.append(row)
    return out


def reward(ok: bool, latency_s: float) -> float:
    return call_reward(WEIGHTS, ok, latency_s, 0.0, latency_target_ms=TARGET_MS, cost_target=0.01)


def config(adaptive: dict | None):
    deps = [{"cluster": c, "protocol": "openai", "endpoints": ["127.0.0.1:9"]} for c in ARMS]
    return parse_config({
        "models": [{"name": "m", "latency_ms": 150, "deployments": deps}],
        "tenants": [{"name": "t", "api_keys": ["0" * 64]}],
        "routing": {"adaptive": adaptive or {}, "cooldown": {"failures": 3, "window_s": 60, "cooldown_s": 30}},
    })


def run_scheduler(tr: list[dict[str, tuple[bool, float]]], adaptive: dict | None, seed: int) -> tuple[float, float]:
    """Mean reward of the scheduler (with or without the bandit) on the trace, and its decide() median us."""
    cfg = config(adaptive)
    s = Scheduler(cfg)
    s.bandit.rng = random.Random(seed)
    req = RouteRequest("m", cfg.tenants[0], "speed")
    total, times = 0.0, []
    for t, row in enumerate(tr):
        now = 1000.0 + t * DT
        t0 = time.perf_counter_ns()
        d = s.decide(req, now, {})
        times.append(time.perf_counter_ns() - t0)
        arm = d.chosen.cluster
        ok, lat = row[arm]
        r = reward(ok, lat)
        total += r
        s.record(arm, lat, ok, now=now)
        if d.learned is not None:
            s.learn("m", "standard", "t", arm, ok=ok, latency_s=lat, cost=0.0, now=now)
    return total / len(tr), statistics.median(times) / 1000


def main() -> int:
    rows = []
    seeds = scaled(list(range(1, 9)), [1])
    results: dict[str, list[float]] = {}
    cost: dict[str, list[float]] = {}
    for seed in seeds:
        tr = trace(CALLS, seed)
        fixed = {arm: sum(reward(*row[arm]) for row in tr) / len(tr) for arm in ARMS}
        best = max(fixed.values())
        rng = random.Random(seed)
        uniform = sum(reward(*row[rng.choice(ARMS)]) for row in tr) / len(tr)
        policies = {
            "scheduler (score + feedback)": run_scheduler(tr, None, seed),
            "adaptive (half-life 30 s)": run_scheduler(tr, {"models": ["m"], "half_life_s": 30,
                                                            "latency_target_ms": TARGET_MS,
                                                            "reward": WEIGHTS.model_dump()}, seed),
            "adaptive, no forgetting": run_scheduler(tr, {"models": ["m"], "half_life_s": 1e9,
                                                          "latency_target_ms": TARGET_MS,
                                                          "reward": WEIGHTS.model_dump()}, seed),
        }
        results.setdefault("best fixed arm", []).append(0.0)
        results.setdefault("uniform", []).append(best - uniform)
        for name, (mean, us) in policies.items():
            results.setdefault(name, []).append(best - mean)
            cost.setdefault(name, []).append(us)
    print(f"{CALLS} calls per trace, {len(seeds)} trace(s); regret = best fixed arm's mean reward - policy's")
    print(f"{'policy':<30} {'regret/call':>12} {'sd':>8} {'decide us':>10}")
    for name, regrets in results.items():
        us = statistics.median(cost[name]) if name in cost else float("nan")
        sd = statistics.stdev(regrets) if len(regrets) > 1 else 0.0
        print(f"{name:<30} {statistics.mean(regrets):>12.4f} {sd:>8.4f} {us:>10.1f}")
        rows.append({"bench": "bandit", "case": name, "metric": "regret_per_call",
                     "value": round(statistics.mean(regrets), 5), "unit": "reward", "sd": round(sd, 5),
                     **({"decide_us": round(us, 2)} if name in cost else {})})
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
