"""Figures a scenario measured, appended as JSON lines to $MODELYARD_CHAOS_FIGURES when set:
bench/reliability.py renders docs/reliability.md from them."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from tests.chaos.traffic import Shot


def served_rps(shots: Iterable[Shot]) -> float:
    """Successful requests per second over the span the shots covered."""
    shots = list(shots)
    if not shots:
        return 0.0
    span = max(s.ended for s in shots) - min(s.started for s in shots)
    return sum(1 for s in shots if s.ok) / span if span > 0 else 0.0


def recovery_s(shots: Iterable[Shot], fault_at: float) -> float:
    """From the fault to the start of the first request after which every request succeeded (0: none failed)."""
    ordered = sorted(shots, key=lambda s: s.started)
    bad = [s for s in ordered if not s.ok and not s.abandoned]
    if not bad:
        return 0.0
    last_bad = max(s.started for s in bad)
    after = [s.started for s in ordered if s.started > last_bad]
    return max(0.0, (after[0] if after else last_bad) - fault_at)


def record(scenario: str, fault: str, **figures: float | int | str) -> None:
    path = os.environ.get("MODELYARD_CHAOS_FIGURES")
    if not path:
        return
    with open(path, "a") as f:
        f.write(json.dumps({"scenario": scenario, "fault": fault, **figures}) + "\n")
