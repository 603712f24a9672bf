"""Smoke mode: every benchmark's same code path at a second or two per case, so `make test` runs
them all and a benchmark that breaks fails CI. `bench/run_all.py --smoke` (or
MODELYARD_BENCH_SMOKE=1 for one script) turns it on; its figures mean nothing, its failures do."""

from __future__ import annotations

import os
from typing import TypeVar

ENV = "MODELYARD_BENCH_SMOKE"
SMOKE = os.environ.get(ENV, "") not in ("", "0")

T = TypeVar("T")


def scaled(full: T, smoke: T) -> T:
    """`full` in a real run, `smoke` in a smoke run."""
    return smoke if SMOKE else full
