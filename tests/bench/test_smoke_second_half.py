"""The other half of the bench smoke (tests/bench/test_smoke.py has the first and says why)."""

from __future__ import annotations

import pytest

from bench import run_all
from tests.bench.smoke_check import HALVES, bench_id, check_smoke


@pytest.mark.e2e
@pytest.mark.timeout(run_all.SMOKE_TIMEOUT_S + 30)
@pytest.mark.parametrize("script", HALVES[1], ids=bench_id)
def test_bench_smoke(script) -> None:
    check_smoke(script)
