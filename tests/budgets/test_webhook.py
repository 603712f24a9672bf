"""The soft-limit webhook: the JSON a receiver gets, retried a bounded number of times from its own
thread, and drained on close."""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import pytest
from aiohttp import web

from budgets.decision import Standing
from budgets.periods import window
from budgets.webhook import ATTEMPTS, WebhookSender, payload
from contracts.config.keys import Budget
from tests.stack_config import free_port
from tests.threaded_app import ThreadedApp

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC).timestamp()
STANDING = Standing("key", "key_1", "acme", Budget(usd=10, period="week", soft_share=0.8), 8.5, window("week", NOW))


def test_the_payload_says_who_how_much_and_when_it_resets() -> None:
    import orjson

    assert orjson.loads(payload(STANDING, NOW)) == {
        "event": "budget.soft_limit", "scope": "key", "id": "key_1", "tenant": "acme", "spend": 8.5,
        "budget": 10.0, "soft_share": 0.8, "used_ratio": 0.85, "period": "week",
        "period_start": "2026-11-30T00:00:00Z", "reset": "2026-12-07T00:00:00Z", "reset_in_s": 280_800,
        "sent_at": NOW}


def test_a_failing_receiver_is_retried_and_a_dead_one_given_up_on(caplog: pytest.LogCaptureFixture) -> None:
    seen: list[bytes] = []

    async def hook(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.Response(status=503 if len(seen) == 1 else 204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    with ThreadedApp(app) as srv:
        sender = WebhookSender(f"http://127.0.0.1:{srv.port}/hook", backoff_s=0.01)
        sender.send(b'{"n": 1}')
        sender.close()
    assert seen == [b'{"n": 1}', b'{"n": 1}']  # a 503, then taken

    dead = WebhookSender(f"http://127.0.0.1:{free_port()}/hook", backoff_s=0.01, timeout_s=1)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="modelyard.budgets"):
        dead.send(b"{}")
        dead.close()
    assert time.monotonic() - started < 5
    assert f"gave up after {ATTEMPTS} attempts" in caplog.text
