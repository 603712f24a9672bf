"""The metering store's `decisions` table as the tuner's input: the whole demand, and a what-if
that reproduces a live Limiter's decisions exactly on the same clock."""

from __future__ import annotations

import random
from pathlib import Path

from contracts.config.ratelimit import parse_config
from extproc.telemetry.metering import DecisionRecord, MeteringStore, MeterRecord
from ratelimit import Limiter, RequestContext
from ratelimit.tuning.traces import read_metering
from ratelimit.tuning.whatif import simulate

LIMITS = [
    {"scope": "tenant", "match": "demo-limited", "unit": "requests", "rate": 1, "burst": 3},
    {"scope": "tenant", "match": "*", "unit": "requests", "rate": 4, "burst": 4},
    {"scope": "tier", "match": "L2", "unit": "requests", "rate": 3, "burst": 5},
    {"scope": "tenant", "match": "*", "tier": "L3", "unit": "tokens", "rate": 2000, "burst": 3000},
    {"scope": "global", "unit": "requests", "rate": 20, "burst": 25},
]
TENANTS = {"demo-limited": "L3", "a": "L2", "b": "L2", "c": "L3", "d": "L1"}


async def test_whatif_reproduces_a_live_limiter_from_the_decisions_table(tmp_path: Path) -> None:
    cfg = parse_config({"limits": LIMITS})
    now = [0]
    limiter = Limiter(cfg, clock=lambda: now[0])
    store = MeteringStore(tmp_path / "m.sqlite")
    rnd = random.Random(3)
    live: dict[str, int] = {}
    t0 = 1_700_000_000_000_000
    for i in range(600):
        now[0] += rnd.choice((0, 1_000, 20_000, 150_000, 700_000))  # salvos and pauses
        tenant = rnd.choice(list(TENANTS))
        ctx = RequestContext(tenant, TENANTS[tenant], "gpu", "standard")
        est = rnd.randrange(10, 900)
        d = await limiter.acquire(ctx, est)
        live[tenant] = live.get(tenant, 0) + (not d.allowed)
        ts = (t0 + now[0]) / 1e6
        store.record_decision(DecisionRecord(ts, f"t{i}", tenant, TENANTS[tenant], "gpu", "standard", "m",
                                             d.allowed, 1, est, d.limited_by, limiter.bound_rule(ctx, d), d.store))
        if d.allowed:  # the upstream reports what it used: the estimate, so the replay charges the same
            await limiter.reconcile(d.reservation, est)
            store.record(MeterRecord(ts, f"t{i}", tenant, TENANTS[tenant], "m", "gpu", "standard", 200, 1.0, None,
                                     est, 0, 0.0, "s", ""))
    store.close()
    trace = read_metering(tmp_path / "m.sqlite")
    assert len(trace) == 600 and trace.live_refused is not None
    w = simulate(trace, cfg, "tenant")
    assert sum(live.values()) > 30 and len(w.total.bound_by) >= 3, w.total.bound_by  # several rules bound
    for tenant, n in live.items():
        assert w.per_key[tenant].live_rejected == n
        assert w.per_key[tenant].rejected == n, tenant
    assert w.refused == trace.live_refused


def test_an_older_store_without_decisions_reads_its_requests(tmp_path: Path) -> None:
    store = MeteringStore(tmp_path / "m.sqlite")
    store.record(MeterRecord(1.0, "t", "a", "L1", "m", "gpu", "standard", 200, 1.0, None, 3, 4, 0.0, "s", ""))
    store.close()
    trace = read_metering(tmp_path / "m.sqlite")
    assert len(trace) == 1 and trace.live_refused is None and trace.tok_nano == [7 * 10**9]


def test_an_async_tasks_usage_counts_once(tmp_path: Path) -> None:
    """Accepted (a decision asking 1 request, 500 tokens), replayed (0 requests), then answered
    with 120 tokens: the replay's row carries the usage, the acceptance its own ask."""
    store = MeteringStore(tmp_path / "m.sqlite")
    for ts, requests in ((1.0, 1), (2.0, 0)):
        store.record_decision(DecisionRecord(ts, "task-1", "a", "L1", "gpu", "standard", "m", True, requests, 500,
                                             "", "", "memory"))
    store.record_decision(DecisionRecord(3.0, "", "b", "", "", "", "", False, 1, 0, "tenant:b:requests",
                                         "tenant:b:requests", "memory"))  # from Envoy's filter: no task
    store.record(MeterRecord(2.5, "task-1", "a", "L1", "m", "gpu", "standard", 200, 1.0, None, 20, 100, 0.0, "s", ""))
    store.close()
    trace = read_metering(tmp_path / "m.sqlite")
    assert trace.req_nano == [10**9, 0, 10**9]
    assert trace.tok_nano == [500 * 10**9, 120 * 10**9, 0]
    assert trace.live_refused == [False, False, True]
    assert trace.cols["tenant"] == ["a", "a", "b"] and trace.cols["cluster"][2] is None


def test_budget_refusals_are_not_demand_on_the_buckets(tmp_path: Path) -> None:
    store = MeteringStore(tmp_path / "m.sqlite")
    store.record_decision(DecisionRecord(1.0, "t1", "a", "L1", "gpu", "standard", "m", True, 1, 50, "", "", "memory"))
    store.record_decision(DecisionRecord(2.0, "t2", "a", "L1", "gpu", "standard", "m", False, 1, 50,
                                         "budget:tenant:a", "1 usd per day", "budget"))
    store.close()
    trace = read_metering(tmp_path / "m.sqlite")
    assert len(trace) == 1 and trace.live_refused == [False]
