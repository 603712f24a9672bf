"""8. Clients leaving streams at random: nobody's failure (no cooldown, no fail open on it), and
the extproc's memory stays flat from the first tenth of the streams to the last."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos.figures import record
from tests.chaos.observe import metered_rows, metric, rss_kib
from tests.chaos.settings import sizes
from tests.chaos.stacks import TWIN, A
from tests.chaos.traffic import chat_body, client, disconnecting_streams, send

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


async def _after(url: str, n: int) -> list:
    async with client(4) as c:
        return [await send(c, url, chat_body(TWIN, f"after {i}", stream=i % 2 == 0)) for i in range(n)]


def test_random_disconnects_leave_no_cooldown_and_flat_memory(fresh_twins) -> None:
    stack, sz = fresh_twins, sizes()
    metrics = stack.cfg.extproc.metrics_address
    pid = stack.child("extproc").proc.pid
    n, warm = sz.disconnects, sz.disconnects // 10
    started = time.monotonic()
    first = asyncio.run(disconnecting_streams(stack.url, TWIN, warm, sz.concurrency))
    rss_warm = rss_kib(pid)
    rest = asyncio.run(disconnecting_streams(stack.url, TWIN, n - warm, sz.concurrency, seed=11))
    rss_end = rss_kib(pid)
    took = time.monotonic() - started
    shots = first + rest
    assert [s.status for s in shots if s.status != 200] == []  # every stream began fine; the client left
    assert rss_end <= rss_warm * 1.10, (rss_warm, rss_end)
    after = asyncio.run(_after(stack.url, 20))
    assert [s.status for s in after if not s.ok] == []
    assert {s.cluster for s in after} == {A}
    assert metric(metrics, "modelyard_routing_fail_open_total", check="cooldown") == 0
    sample = {s.task_id for s in shots[-200:]}  # aborted streams are metered for what streamed
    assert len(metered_rows(stack.cfg.extproc.metering_db, sample)) == len(sample)
    record("clients disconnect mid-stream", f"{n} streams dropped by the client after 1-4 chunks",
           ok_rps=round(n / took, 1), lost=0, recovery_s=0.0,
           detail=f"extproc RSS {rss_warm // 1024} MiB after {warm}, {rss_end // 1024} MiB after {n}")
