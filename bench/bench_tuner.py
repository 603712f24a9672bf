"""`modelyard ratelimit tune` on a million requests: one exact replay, a frontier sweep, a what-if.

Traffic: 1,000,000 generated requests (Poisson arrivals at 1000/s with salvos, 50 tenants in three
tiers, tokens per request). Baseline, same run: a plain Python loop that calls
`ratelimit.bucket.try_take` for each request of the trace. Every figure is requests replayed per
second and its ratio to that baseline (a replay that refuses differently than the baseline fails
the bench).
"""

from __future__ import annotations

import os
import random
import sys
import time

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.smoke import scaled  # noqa: E402
from contracts.config.ratelimit import parse_config  # noqa: E402
from ratelimit import bucket  # noqa: E402
from ratelimit.bucket import NANO, US, BucketParams  # noqa: E402
from ratelimit.tuning.frontier import auto_rates, sweep  # noqa: E402
from ratelimit.tuning.replay import count  # noqa: E402
from ratelimit.tuning.traces import Trace  # noqa: E402
from ratelimit.tuning.whatif import simulate  # noqa: E402

N = scaled(1_000_000, 20_000)
LIMITS = [
    {"scope": "tenant", "match": "*", "rate": 30, "burst": 60},
    {"scope": "tenant", "match": "*", "tier": "L3", "unit": "tokens", "rate": 5000, "burst": 20000},
    {"scope": "tier", "match": "L1", "rate": 400, "burst": 800},
    {"scope": "global", "rate": 900, "burst": 2000},
]


def make_trace(n: int = N, seed: int = 7) -> Trace:
    rng = random.Random(seed)
    tr = Trace(has_tokens=True)
    t = 0
    tiers = ("L1", "L2", "L3")
    while len(tr) < n:
        t += int(rng.expovariate(1000) * US) + 1
        tenant = rng.randrange(50)
        for _ in range(rng.randint(2, 20) if rng.random() < 0.01 else 1):
            tr.add(t, NANO, rng.randint(20, 900) * NANO,
                   {"tenant": f"t{tenant}", "tier": tiers[tenant % 3], "cluster": f"c{tenant % 4}",
                    "channel": "standard", "model": "m"})
    return tr


def baseline(times: list[int], costs: list[int], params: BucketParams) -> int:
    st = bucket.full(params, times[0])
    rejected = 0
    for t, c in zip(times, costs):
        ok, st, _ = bucket.try_take(st, params, c, t)
        rejected += not ok
    return rejected


def timed(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def main() -> int:
    tr = make_trace()
    times, costs = tr.ts_us, tr.req_nano
    params = BucketParams(950_000, 1500 * NANO)  # 950/s, burst 1500: refuses some of the salvos
    base_rej, base_s = timed(baseline, times, costs, params)
    base = N / base_s
    rows = []

    def row(case: str, value: float) -> None:
        rows.append({"bench": "tuner", "case": case, "metric": "requests_per_s", "value": round(value),
                     "unit": "1/s", "baseline": round(base), "ratio": round(value / base, 4)})

    o, s = timed(count, times, costs, params)
    if o.rejected != base_rej:
        print(f"FAILED: tuner replay: {o.rejected} refusals, baseline {base_rej}")
        return 1
    row("replay 1M (1 bucket)", N / s)
    series = tr.series("global", "requests")["*"]
    rates = auto_rates(series, 8)
    fr, s = timed(sweep, "*", series, rates, 0.01)
    replays = len(rates)  # a frontier point costs ~20 replays (bisection); figure: sweep requests/s
    row(f"frontier {replays} rates, 1M each", N * replays / s)
    sweep_s = s
    tenants = tr.series("tenant", "tokens")
    t0 = time.perf_counter()
    for v, ser in tenants.items():
        sweep(v, ser, auto_rates(ser, 4), 0.01)
    per_key_s = time.perf_counter() - t0
    row("frontier 50 tenants x 4 rates", N * 4 / per_key_s)
    w, s = timed(simulate, tr, parse_config({"limits": LIMITS}), "tenant")
    row("what-if 1M, 4 rules", N / s)
    print(f"trace: {N:,} requests over {(times[-1] - times[0]) / US:.0f} s; baseline try_take loop "
          f"{base_s:.2f} s ({base:,.0f} requests/s), {base_rej} refused")
    print(f"frontier (global, {len(rates)} rates) {sweep_s:.1f} s, pick rate {fr.pick.rate if fr.pick else '-'}; "
          f"50 tenants x 4 rates (tokens) {per_key_s:.1f} s; what-if refused {w.total.rejected:,}")
    print(f"{'case':<34} {'requests/s':>14} {'vs baseline':>12}")
    for r in rows:
        print(f"{r['case']:<34} {r['value']:>14,} {r['ratio']:>12.3f}")
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
