"""Latency in admission: the window and its percentile, the objective judged only on enough calls,
and a deployment over its objective counting as loaded for the fast-channel tiers; healed by time."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contracts.config.service_levels import LatencyObjective
from contracts.errors import ConfigError
from extproc.routing import RouteRequest, Scheduler
from extproc.routing.latency import LatencyBook, LatencyWindow, judge

from .conftest import dep, fresh, make_config, model, tenant, tenant_of

SLO = LatencyObjective(p99_ms=500, ttft_ms=200, window_s=10, min_samples=5)


def test_nearest_rank_percentile_and_expiry() -> None:
    w = LatencyWindow(window_s=10)
    assert w.percentile(0.99, 0.0) is None
    for i, v in enumerate([0.3, 0.1, 0.2, 0.5, 0.4]):
        w.add(float(i), v)
    assert (w.percentile(0.5, 4.0), w.percentile(0.99, 4.0), w.percentile(0.2, 4.0)) == (0.3, 0.5, 0.1)
    assert w.count(10.5) == 4  # the sample of t=0 is 10.5 s old: out
    assert w.percentile(0.99, 13.5) == 0.4 and w.count(13.5) == 1  # only t=4's 0.4 is left
    assert w.percentile(0.99, 14.0) is None and w.count(14.0) == 0


def test_the_window_is_bounded_oldest_out() -> None:
    w = LatencyWindow(window_s=100, max_samples=3)
    for i, v in enumerate([9.0, 1.0, 2.0, 3.0]):
        w.add(float(i), v)
    assert w.count(4.0) == 3 and w.percentile(1.0, 4.0) == 3.0


@given(st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=200), st.floats(0.01, 1))
def test_percentile_is_the_sorted_samples_nearest_rank(values: list[float], q: float) -> None:
    w = LatencyWindow(window_s=1e9)
    for i, v in enumerate(values):
        w.add(float(i), v)
    ordered = sorted(values)
    got = w.percentile(q, float(len(values)))
    assert got == ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def test_too_few_calls_are_not_judged_and_streams_count_their_ttft() -> None:
    book = LatencyBook({"c": SLO})
    for i in range(4):
        book.record("c", 2.0, None, float(i))
    assert book.loaded(4.0) == {}  # 4 calls at 2 s: fewer than min_samples, fail open
    book.record("c", 2.0, None, 4.0)
    assert book.loaded(4.0) == {"c": (0.8, "p99 2000 ms over its 500 ms objective")}
    ttft = LatencyBook({"c": SLO})
    for i in range(5):  # long streams, quick first chunks: within the TTFT objective
        ttft.record("c", 30.0, 0.05, float(i))
    st_ = ttft.state("c", 5.0)
    assert st_ is not None and st_.over == "" and st_.p99_samples == 0 and st_.ttft_samples == 5
    for i in range(5):
        ttft.record("c", 30.0, 0.9, 5.0 + i)
    assert ttft.loaded(10.0)["c"][1] == "ttft p99 900 ms over its 200 ms objective"
    book.record("other", 9.0, None, 0.0)  # no objective: nothing kept
    assert book.state("other", 0.0) is None


def test_it_heals_by_time_alone() -> None:
    book = LatencyBook({"c": SLO})
    for i in range(10):
        book.record("c", 1.0, None, float(i))
    assert "c" in book.loaded(9.0)
    assert book.loaded(14.9)  # the 5 newest calls (t = 5..9) are still in the 10 s window
    assert book.loaded(15.0) == {}  # 4 left: too few to judge, admitted again with no call at all


def test_a_reload_keeps_the_samples_of_deployments_that_keep_an_objective() -> None:
    book = LatencyBook({"c": SLO, "d": SLO})
    for i in range(5):
        book.record("c", 1.0, None, float(i))
    book.retune({"c": SLO.model_copy(update={"p99_ms": 2000.0})})
    assert book.loaded(5.0) == {} and book.state("d", 5.0) is None
    book.retune({"c": SLO})
    assert "c" in book.loaded(5.0)


def test_judge_and_the_objective_model() -> None:
    assert judge(SLO, 0.6, 5, None, 0).startswith("p99 600 ms")
    assert judge(SLO, 0.4, 100, 0.1, 100) == ""
    with pytest.raises(ValueError):
        LatencyObjective()
    with pytest.raises(ConfigError):
        make_config([model("m", [dep("m-a", slo={"window_s": 5})])])


@pytest.fixture
def slo_config():
    return make_config(
        [model("big", [dep("big-a", monitored=False),
                       dep("big-fast", channel="fast", monitored=False,
                           slo={"p99_ms": 500, "window_s": 30, "min_samples": 5})])],
        tenants=[tenant("gold", "L1"), tenant("silver", "L2"), tenant("bronze", "L3")],
    )


def test_over_its_objective_a_fast_deployment_is_closed_to_l2_and_l3_not_l1(slo_config) -> None:
    s = Scheduler(slo_config)
    marks = fresh(slo_config, now=100.0)

    def channel(name: str, now: float) -> str:
        d = s.decide(RouteRequest("big", tenant_of(slo_config, name), want_fast=True), now, marks, dry_run=True)
        return d.channel

    assert [channel(t, 100.0) for t in ("gold", "silver", "bronze")] == ["fast", "fast", "fast"]
    for i in range(4):
        s.record("big-fast", 0.1, False, now=100.0 + i)  # failures: the error rate's, not latency's
        s.record("big-fast", 1.2, True, now=100.0 + i)
    assert channel("silver", 104.0) == "fast"  # 4 answers: not judged yet
    s.record("big-fast", 1.2, True, now=104.0)
    assert [channel(t, 104.0) for t in ("gold", "silver", "bronze")] == ["fast", "standard", "standard"]
    d = s.decide(RouteRequest("big", tenant_of(slo_config, "silver"), want_fast=True), 104.0, marks, dry_run=True)
    assert d.downgraded and d.chosen.cluster == "big-a"
    (r,) = [r for r in d.rejected if r.cluster == "big-fast"]
    assert r.reason == "fast channel closed to L2 at watermark 0.80 (p99 1200 ms over its 500 ms objective)"
    # The load term sees it too, as it would a watermark of 0.8.
    gold = s.decide(RouteRequest("big", tenant_of(slo_config, "gold"), want_fast=True), 104.0, marks, dry_run=True)
    assert gold.chosen.terms["load"] == pytest.approx(0.2)
    # No more calls: once the first slow answer is 30 s old, too few are left to judge; L2 goes fast again.
    assert channel("silver", 129.9) == "standard"
    assert channel("silver", 130.0) == "fast"


def test_explain_shows_the_measure_and_replays_a_running_extprocs(slo_config) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from extproc.routing.explain import explain, format_explain, latency_states
    from extproc.telemetry.metrics import LatencyObjectives

    s = Scheduler(slo_config)
    for i in range(6):
        s.record("big-fast", 0.9, True, now=100.0 + i)
    req = RouteRequest("big", tenant_of(slo_config, "silver"), want_fast=True)
    doc = explain(s, req, 106.0, fresh(slo_config, now=106.0))
    (row,) = [r for r in doc["rows"] if r["cluster"] == "big-fast"]
    assert row["latency"]["p99_ms"] == 900.0 and row["latency"]["load"] == 0.8
    assert row["filtered"].endswith("(p99 900 ms over its 500 ms objective)")
    out = format_explain(doc)
    assert "big-fast             p99 900 ms of 6 calls (objective 500 ms), window 30 s: over: counts as load 0.80" in out
    # --live: the running extproc's /metrics, judged the same way by a scheduler that measured nothing.
    collector = LatencyObjectives()
    collector.source = lambda: s.latency.exposition(106.0)
    registry = CollectorRegistry()
    registry.register(collector)
    live = latency_states(slo_config, generate_latest(registry).decode())
    assert live["big-fast"].over == "p99 900 ms over its 500 ms objective"
    replayed = explain(Scheduler(slo_config), req, 106.0, fresh(slo_config, now=106.0), latency=live)
    assert replayed["chosen"] == "big-a" and replayed["downgraded"]
    assert latency_states(slo_config, "")["big-fast"].over == ""  # nothing measured: not judged
