"""A/B readouts over metering rows: intervals, verdicts, and the reader joining feedback by task id."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from extproc.routing.ab_readout import (
    ArmCall,
    quantile_interval,
    read_arm_calls,
    readout,
    render_table,
    wilson,
)


def test_wilson_interval_matches_its_formula_and_stays_in_bounds() -> None:
    e = wilson(5, 100)
    assert e.value == 0.05 and e.low == pytest.approx(0.02154, abs=1e-4) and e.high == pytest.approx(0.11175, abs=1e-4)
    zero = wilson(0, 30)
    assert zero.value == 0.0 and zero.low == 0.0 and 0 < zero.high < 0.12  # no errors seen is not "none ever"
    assert wilson(0, 0).value is None


def test_quantile_interval_brackets_the_quantile_with_order_statistics() -> None:
    xs = [float(i) for i in range(1, 1001)]
    p50 = quantile_interval(xs, 0.5)
    assert p50.value == 500.0 and 460 < p50.low < 500 < p50.high < 540
    p99 = quantile_interval(xs[:50], 0.99)
    assert p99.value == 50.0 and p99.high is None  # 50 calls cannot bound a p99 from above


def _calls(arm: str, n: int, latency: float, error_every: int = 0, score: float | None = None,
           rng: random.Random | None = None) -> list[ArmCall]:
    rng = rng or random.Random(1)
    return [ArmCall("speed", arm, 502 if error_every and i % error_every == 0 else 200,
                    latency * rng.uniform(0.9, 1.1), latency / 2, 0.001, score) for i in range(n)]


def test_the_verdict_names_the_better_arm_per_measure() -> None:
    calls = _calls("A", 200, 100.0, score=0.9) + _calls("B", 200, 50.0, error_every=5, score=0.2)
    (exp,) = readout(calls)
    assert exp.strategy == "speed" and [a.arm for a in exp.arms] == ["A", "B"]
    assert exp.verdicts["latency_p50_ms"] == "B" and exp.verdicts["ttft_p50_ms"] == "B"
    assert exp.verdicts["error_rate"] == "A" and exp.verdicts["feedback"] == "A"
    assert exp.verdicts["cost_per_request"] == "no difference yet"
    a, b = exp.arms
    assert a.requests == 200 and b.error_rate.value == pytest.approx(0.2)
    # Latency is read over the answered calls only: an error's latency is not the arm's speed.
    assert b.latency_p50_ms.n == 160


def test_too_few_calls_say_so_and_strategies_without_a_b_arm_are_left_out() -> None:
    calls = _calls("A", 10, 100.0) + _calls("B", 10, 10.0) + [ArmCall("cost", "A", 200, 1.0, None, 0.0)]
    (exp,) = readout(calls)
    assert set(exp.verdicts.values()) == {"not enough data yet"}
    assert "not enough data yet" in render_table([exp])


def test_reader_joins_feedback_of_the_same_tenant_and_reads_a_window(tmp_path: Path) -> None:
    from extproc.telemetry.metering import FeedbackRecord, MeteringStore, MeterRecord

    db = tmp_path / "m.sqlite"
    store = MeteringStore(db)
    for i, (arm, ts) in enumerate([("A", 100.0), ("B", 200.0), ("B", 300.0)]):
        store.record(MeterRecord(ts, f"t{i}", "acme", "L1", "m", "c", "standard", 200, 10.0, None, 1, 1, 0.5,
                                 "speed", arm))
    store.record_feedback(FeedbackRecord(1.0, "t1", "acme", None, 1.0, None))
    store.record_feedback(FeedbackRecord(2.0, "t1", "acme", None, 0.0, '{"why": "slow"}'))
    store.record_feedback(FeedbackRecord(3.0, "t2", "other", None, 1.0, None))  # not the call's tenant
    store.close()
    calls = list(read_arm_calls([db], since=150.0, until=1000.0))
    assert [(c.arm, c.score) for c in calls] == [("B", 0.5), ("B", None)]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM feedback").fetchone()[0] == 3
