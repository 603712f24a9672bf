"""7. Every watermark agent stopped: no deployment has a fresh reading, so routing goes on as if
unmonitored (fail open) and says so on /metrics."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos.figures import record, served_rps
from tests.chaos.observe import metric
from tests.chaos.settings import sizes
from tests.chaos.stacks import TWIN
from tests.chaos.traffic import chat_body, load

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def test_all_agents_stopped_traffic_fails_open(fresh_twins) -> None:
    stack, sz = fresh_twins, sizes()
    metrics = stack.cfg.extproc.metrics_address
    agents = [c for c in stack.children if c.name.startswith("agent@")]
    assert len(agents) == 2
    before = metric(metrics, "modelyard_routing_fail_open_total", check="watermarks")
    stopped: list[float] = []

    def stop_agents() -> None:
        stopped.append(time.monotonic())
        for a in agents:
            a.proc.terminate()
            a.proc.wait(10)

    try:
        shots = asyncio.run(load(stack.url, sz.load_s, sz.concurrency, lambda i: chat_body(TWIN, f"blind {i}"),
                                 during=stop_agents, at=0.5))
    finally:
        for a in agents:
            stack.restart(a.name)
    lost = [s for s in shots if not s.ok]
    assert [s.status for s in lost] == []
    assert [s for s in shots if s.started > stopped[0] + 1.0], "no load once the readings went stale"
    assert metric(metrics, "modelyard_routing_fail_open_total", check="watermarks") > before
    record("watermark agents stopped", "every agent SIGTERMed mid-load", ok_rps=round(served_rps(shots), 1),
           lost=0, recovery_s=0.0, detail=f"{len(shots)} requests, all 200; fail-open counter rose")
