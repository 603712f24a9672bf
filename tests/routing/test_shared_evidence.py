"""The learning strategy's evidence shared through a real redis-server (extproc/admission/shared_evidence.py):
what one replica learns steers another's shares after a sync; a Redis that goes away leaves each
learning alone and keeps what was not stored."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from contracts.config.routing import AdaptiveSettings
from extproc.admission.shared_evidence import SharedEvidence
from extproc.routing.bandit import Bandit
from tests.ratelimit.redis_server import REDIS_BIN, RedisServer

pytestmark = pytest.mark.skipif(not REDIS_BIN, reason="redis-server not installed")
KEY = ("m", "standard", "")
SETTINGS = AdaptiveSettings(models=["m"], store="redis", refresh_s=0, draws=2000, half_life_s=600)


@pytest.fixture
def redis_server():
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def _replica(url: str, seed: int) -> tuple[Bandit, SharedEvidence]:
    b = Bandit(SETTINGS, random.Random(seed), pending={})
    return b, SharedEvidence(url, lambda: b, prefix="{test}")


def test_what_one_replica_learns_steers_the_other(redis_server) -> None:
    async def run() -> None:
        one, sync_one = _replica(redis_server.url, 1)
        two, sync_two = _replica(redis_server.url, 2)
        t = time.monotonic()  # the bandit's clock is the scheduler's
        two.shares(KEY, ["a", "b"], t)  # two routes this group but has learned nothing
        for _ in range(30):
            one.learn(KEY, "a", 0.0, t)
            one.learn(KEY, "b", 1.0, t)
        await sync_one.sync_once()
        await sync_two.sync_once()
        shares = two.shares(KEY, ["a", "b"], time.monotonic())
        assert shares["b"] > 0.9, shares
        ev = two.evidence[KEY]
        assert ev["a"].losses == pytest.approx(30, rel=0.01) and ev["b"].wins == pytest.approx(30, rel=0.01)
        # two's own lesson adds to one's (not replaces it)
        two.learn(KEY, "a", 1.0, time.monotonic())
        await sync_two.sync_once()
        await sync_one.sync_once()
        assert one.evidence[KEY]["a"].wins == pytest.approx(1, rel=0.01)
        assert one.evidence[KEY]["a"].losses == pytest.approx(30, rel=0.01)
        await sync_one.close()
        await sync_two.close()

    asyncio.run(run())


def test_a_dark_redis_keeps_the_pending_evidence(redis_server, caplog) -> None:
    async def run() -> None:
        b, sync = _replica(redis_server.url, 3)
        b.learn(KEY, "a", 0.0, time.monotonic())
        redis_server.stop()
        await sync.sync_once()  # no exception: logged, and the evidence waits for the next round
        assert "Redis does not answer" in caplog.text
        assert b.pending is not None and b.pending[(KEY, "a")].losses == pytest.approx(1, rel=0.01)
        assert b.evidence[KEY]["a"].losses == pytest.approx(1, rel=0.01)  # the local lesson still routes
        await sync.close()

    asyncio.run(run())
