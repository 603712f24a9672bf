"""1. Load that ends abruptly, again and again (wrk runs cut off at their deadline, an async loop
cancelled mid-flight): the clients that left are nobody's failure, so no deployment cools down."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

from bench.outcomes import Tally
from bench.wrk_load import post_script, run_wrk
from tests.chaos.figures import record
from tests.chaos.observe import metered_rows, metric
from tests.chaos.settings import sizes
from tests.chaos.stacks import TWIN, A
from tests.chaos.traffic import PINNED, chat_body, client, load, send
from tests.conftest import DEMO_KEY

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]


async def _cancelled_streams(url: str, concurrency: int) -> None:
    """A stream-heavy loop killed half a second in: every open stream is dropped by the client."""
    task = asyncio.ensure_future(load(url, 30, concurrency, lambda i: chat_body(TWIN, f"cut {i}", stream=True)))
    await asyncio.sleep(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _after(url: str, n: int) -> list:
    async with client(4) as c:
        return [await send(c, url, chat_body(TWIN, f"after {i}", stream=i % 2 == 1)) for i in range(n)]


def test_abrupt_load_ends_leave_no_cooldown(fresh_twins, tmp_path) -> None:
    stack, sz = fresh_twins, sizes()
    metrics = stack.cfg.extproc.metrics_address
    script = tmp_path / "chat.lua"
    script.write_text(post_script(orjson.dumps(chat_body(TWIN, "abrupt end")).decode(),
                                  {"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json",
                                   **PINNED}))
    tally = Tally("chaos", "abrupt")
    started = time.monotonic()
    for _ in range(sz.abrupt_runs):
        run_wrk(f"{stack.url}/v1/chat/completions", 16, 1, script, tally)
        asyncio.run(_cancelled_streams(stack.url, sz.concurrency))
    load_s = time.monotonic() - started

    after = asyncio.run(_after(stack.url, 40))
    assert tally.unexpected == {}, tally.failure()  # what wrk counted before each cut was all 200
    assert [s.status for s in after if not s.ok] == []
    assert {s.cluster for s in after} == {A}  # the first deployment was never set aside
    assert metric(metrics, "modelyard_routing_fail_open_total", check="cooldown") == 0
    assert metric(metrics, "modelyard_requests_total", status="503") == 0
    rows = metered_rows(stack.cfg.extproc.metering_db, {s.task_id for s in after})
    assert sorted(set(rows.values())) == [200] and len(rows) == len(after)
    served = metric(metrics, "modelyard_requests_total", cluster=A, status="200")
    assert served >= tally.ok  # every answer wrk saw was metered (plus those it cut)
    record("abrupt load ends", f"{sz.abrupt_runs} wrk runs + {sz.abrupt_runs} cancelled stream loops",
           ok_rps=round(tally.ok / load_s, 1), lost=0, recovery_s=0.0,
           detail=f"{tally.ok} answers before the cuts; {len(after)} requests after: all 200, none cooled down")
    httpx.get(f"{stack.url}/v2/health/ready", timeout=5)
