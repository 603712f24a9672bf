"""The smoke check of one bench, shared by the two smoke test files (split so that pytest-xdist's
--dist loadfile runs the two halves on two workers at once)."""

from __future__ import annotations

import math
from pathlib import Path

from bench import run_all

BENCHES = run_all.scripts()
# Alternate halves by name: the heavy stack benches land on both sides.
HALVES = (BENCHES[0::2], BENCHES[1::2])


def bench_id(script: Path) -> str:
    return script.stem.removeprefix("bench_")


def check_smoke(script: Path) -> None:
    """make bench's rule: exit 0 (no unexpected status anywhere) and a SUMMARY with finite figures."""
    run = run_all.run_one(script, smoke=True)
    assert run.failure is None, f"{run.failure}\n{run.out[-3000:]}\n{run.err[-3000:]}"
    assert run.rows, run.out[-3000:]
    bench = bench_id(script)
    for row in run.rows:
        assert {"bench", "case", "metric", "value", "unit"} <= set(row), row
        assert isinstance(row["value"], (int, float)) and math.isfinite(row["value"]), row
    assert {row["bench"] for row in run.rows} == {bench.split("_")[0]}, run.rows
