"""2. One upstream killed mid-load while a peer deployment serves the same model: the only
requests a client may lose are those already streaming from the dead one."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.chaos.figures import record, recovery_s, served_rps
from tests.chaos.observe import metered_rows
from tests.chaos.settings import sizes
from tests.chaos.stacks import TWIN, A, B
from tests.chaos.traffic import chat_body, load

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


def test_upstream_killed_mid_load_fails_over_to_its_peer(fresh_twins) -> None:
    stack, sz = fresh_twins, sizes()
    victim = next(c for c in stack.children if c.name.startswith(A + "@"))
    killed: list[float] = []

    def kill() -> None:
        killed.append(time.monotonic())
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()

    try:
        shots = asyncio.run(load(stack.url, sz.load_s, sz.concurrency,
                                 lambda i: chat_body(TWIN, f"request {i}", stream=i % 2 == 0),
                                 during=kill, at=sz.load_s / 3))
    finally:
        stack.restart(victim.name)
    t = killed[0]
    on_victim = [s for s in shots if s.cluster == A and s.started < t]  # answers A had begun
    lost = [s for s in shots if not s.ok]
    assert [s for s in lost if s not in on_victim] == [], [(s.status, s.cluster, s.stream) for s in lost][:10]
    later = [s for s in shots if s.started > t + 0.05]
    assert later and {s.cluster for s in later} == {B}  # Envoy and the scheduler moved to the peer
    ok = {s.task_id for s in shots if s.ok}
    rows = metered_rows(stack.cfg.extproc.metering_db, ok)
    assert len(rows) == len(ok) and set(rows.values()) == {200}
    record("upstream killed", "SIGKILL of deployment A's upstream mid-load, peer B present",
           ok_rps=round(served_rps(shots), 1), lost=len(lost), recovery_s=round(recovery_s(shots, t), 2),
           detail=f"{len(shots)} requests; {len(on_victim)} had begun on A before the kill")
