"""bench/bench_fleet_sim.py: the fleet in simulated time, and bench/fleet_load.py's steady-state rate.

The simulation's ratios stand in for the live bench's only if a run is exactly repeatable and
loses nothing: the same seed gives the same figures, every call is answered with the tokens it
asked for, and a gateway-side queue holds calls without dropping them."""

from __future__ import annotations

import math

from bench import bench_fleet_sim as sim
from bench.fleet_load import LoadRun, Result


def _run(policy: str, variants: str = "") -> dict:
    pol = sim.policies("round_robin,least_request,picker,cache_aware", variants)[policy]
    return sim.Sim(12.0, 3.0, 7, pol.route(), cap=pol.cap, pull=pol.pull).run()


def test_a_seed_gives_the_same_run_to_the_token() -> None:
    a, b = _run("picker"), _run("picker")
    assert a == b
    assert a["calls"] > 20 and a["tokens"] > 0


def test_every_call_is_answered_whatever_routes_it() -> None:
    runs = {p: _run(p) for p in ("round_robin", "least_request", "picker", "cache_aware")}
    runs["oracle:o"] = _run("oracle:o", 'o={"_oracle": 0.25}')
    runs["picker:held"] = _run("picker:held", 'held={"_cap": 2, "_pull": 8}')
    calls = {r["calls"] for r in runs.values()}
    assert len(calls) == 1, calls  # the same arrivals, all answered
    for name, r in runs.items():
        assert sum(r["per_replica"]) == r["calls"], name
        assert r["tok_s"] > 0 and math.isfinite(r["ttft_p99_ms"]), name


def test_a_held_call_waits_for_room_and_round_robin_spreads_evenly() -> None:
    rr = _run("round_robin")
    assert max(rr["per_replica"]) - min(rr["per_replica"]) <= 1
    held = _run("picker:held", 'held={"_cap": 1}')
    free = _run("picker")
    assert held["ttft_p50_ms"] > free["ttft_p50_ms"]  # one call per replica at a time: the rest queue


def test_the_steady_rate_counts_tokens_made_while_arrivals_last_past_their_first_quarter() -> None:
    run = LoadRun(started=100.0, finished=130.0, duration=20.0)
    r = Result(100.0, tokens=40, status=200, ttft=0.1)
    r.marks = [(101.0, 10), (106.0, 10), (119.0, 10), (125.0, 10)]  # before 105, in [105, 120), after 120
    run.results.append(r)
    assert run.steady_tok_s() == 20 / 15
    assert run.summary()["steady_tok_s"] == 20 / 15
