"""How hard the chaos scenarios push: `short` in `make test`, `long` (MODELYARD_CHAOS=long) in
`make chaos` and bench/reliability.py. Same scenarios, only sizes and durations differ."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Sizes:
    name: str
    load_s: float  # how long a scenario's load runs around its fault
    abrupt_runs: int  # back-to-back ~1 s wrk runs cut off mid-flight
    disconnects: int  # streams a client abandons mid-way (the memory check's N)
    concurrency: int


SHORT = Sizes("short", load_s=2.5, abrupt_runs=2, disconnects=1000, concurrency=8)
LONG = Sizes("long", load_s=12.0, abrupt_runs=10, disconnects=10_000, concurrency=16)


def sizes() -> Sizes:
    return LONG if os.environ.get("MODELYARD_CHAOS", "short") == "long" else SHORT
