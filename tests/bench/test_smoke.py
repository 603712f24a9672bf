"""Every benchmark in bench/ runs in smoke mode (its own code path, a second or two per case) and
passes by make bench's rule: exit 0 (no unexpected status anywhere) and a SUMMARY with figures.
A benchmark that breaks fails here, not months later in a `make bench` nobody ran."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run_all
from tests.bench.smoke_check import BENCHES, HALVES, bench_id, check_smoke


def test_every_bench_is_smoked() -> None:
    names = {p.stem for p in BENCHES}
    assert {"bench_queueing", "bench_gateway", "bench_peers"} <= names
    assert len(names) == len(list((Path(run_all.__file__).parent).glob("bench_*.py")))


@pytest.mark.e2e
@pytest.mark.timeout(run_all.SMOKE_TIMEOUT_S + 30)
@pytest.mark.parametrize("script", HALVES[0], ids=bench_id)
def test_bench_smoke(script) -> None:
    check_smoke(script)
