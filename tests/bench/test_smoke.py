"""Every benchmark in bench/ runs in smoke mode (its own code path, a second or two per case) and
passes by make bench's rule: exit 0 (no unexpected status anywhere) and a SUMMARY with figures.
A benchmark that breaks fails here, not months later in a `make bench` nobody ran."""

from __future__ import annotations

import math

import pytest

from bench import run_all

BENCHES = run_all.scripts(smoke=True)


def test_every_bench_but_the_peers_one_is_smoked() -> None:
    names = {p.stem for p in BENCHES}
    assert "bench_queueing" in names and "bench_gateway" in names
    assert names | run_all.NOT_SMOKED == {p.stem for p in run_all.scripts()}


@pytest.mark.e2e
@pytest.mark.timeout(run_all.SMOKE_TIMEOUT_S + 30)
@pytest.mark.parametrize("script", BENCHES, ids=[p.stem.removeprefix("bench_") for p in BENCHES])
def test_bench_smoke(script) -> None:
    run = run_all.run_one(script, smoke=True)
    assert run.failure is None, f"{run.failure}\n{run.out[-3000:]}\n{run.err[-3000:]}"
    assert run.rows, run.out[-3000:]
    bench = script.stem.removeprefix("bench_")
    for row in run.rows:
        assert {"bench", "case", "metric", "value", "unit"} <= set(row), row
        assert isinstance(row["value"], (int, float)) and math.isfinite(row["value"]), row
    assert {row["bench"] for row in run.rows} == {bench.split("_")[0]}, run.rows
