"""`max_inflight` across the workers of one host: the shared slot table and the queue shell over it."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from extproc.admission.concurrency import ConcurrencyLimits
from extproc.admission.host_slots import HostSlots
from tests.core.concurrency_config import slot_config as _config
from tests.ratelimit.redis_server import REDIS_BIN, RedisServer


@pytest.fixture
def redis_server():
    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    srv = RedisServer()
    srv.start()
    yield srv
    srv.stop()


def _grab(path: str, worker: int, tries: int, out: multiprocessing.Queue, done) -> None:
    slots = HostSlots(path, ["a", "b"], worker)
    out.put(sum(slots.take("a", 10) for _ in range(tries)))
    done.wait(30)  # alive until every one has tried: an exited worker's slots would come back


def test_the_bound_is_the_hosts_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "slots")
    HostSlots(path, ["a", "b"], 0)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    done = ctx.Event()
    procs = [ctx.Process(target=_grab, args=(path, w, 50, out, done)) for w in range(1, 5)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    done.set()
    for p in procs:
        p.join(10)
    assert sum(got) == 10, got


def _take_and_die(path: str, ready) -> None:
    slots = HostSlots(path, ["a"], 1)
    assert slots.take("a", 3) and slots.take("a", 3)
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_workers_slots_come_back(tmp_path: Path) -> None:
    path = str(tmp_path / "slots")
    mine = HostSlots(path, ["a"], 0)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_take_and_die, args=(path, ready))
    p.start()
    assert ready.wait(10)
    p.join(10)
    assert mine.held("a") == 2  # still counted: nobody has looked yet
    assert mine.take("a", 3) and mine.take("a", 3) and mine.take("a", 3)  # full: the dead one's are reaped
    assert not mine.take("a", 3)
    mine.give("a")
    assert mine.held("a") == 2


def test_a_restarted_worker_starts_holding_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "slots")
    first = HostSlots(path, ["a"], 1)
    assert first.take("a", 5) and first.take("a", 5)
    again = HostSlots(path, ["a"], 1)  # the same index, a new process
    assert again.held("a") == 0


async def test_two_workers_share_max_inflight_and_hand_slots_across(tmp_path: Path) -> None:
    path = str(tmp_path / "slots")
    w0 = ConcurrencyLimits(_config(2), host=(path, 0))
    w1 = ConcurrencyLimits(_config(2), host=(path, 1))
    a = await w0.acquire("c", "m", "t", "L3")
    b = await w1.acquire("c", "m", "t", "L3")
    assert a is not None and b is not None
    waiting = asyncio.ensure_future(w0.acquire("c", "m", "u", "L3"))
    await asyncio.sleep(0.05)
    assert not waiting.done() and w0.queues["c"].inflight == 1  # free here, but the host is full
    b.release()  # worker 1's slot goes back: worker 0's waiter takes it on its next look
    slot = await asyncio.wait_for(waiting, 2)
    assert slot is not None and isinstance(w0.shared, HostSlots) and w0.shared.held("c") == 2
    a.release()
    slot.release()
    assert w0.shared.held("c") == 0
    await w0.close()
    await w1.close()


async def test_replicas_share_max_inflight_through_redis_leases(redis_server) -> None:
    url = redis_server.url
    r0 = ConcurrencyLimits(_config(2), redis_url=url)
    r1 = ConcurrencyLimits(_config(2), redis_url=url)
    a = await r0.acquire("c", "m", "t", "L3")
    b = await r1.acquire("c", "m", "t", "L3")
    waiting = asyncio.ensure_future(r1.acquire("c", "m", "u", "L3"))
    await asyncio.sleep(0.1)
    assert not waiting.done()  # free on replica 1, but the two replicas hold both slots
    assert a is not None and b is not None
    a.release()  # replica 0's slot goes back to Redis: replica 1's waiter gets it
    slot = await asyncio.wait_for(waiting, 5)
    assert slot is not None
    b.release()
    slot.release()
    await r0.close()
    await r1.close()


async def test_a_dead_replicas_leases_expire(redis_server) -> None:
    from extproc.admission.redis_slots import RedisSlots

    dead = RedisSlots(redis_server.url, ["c"], lease_s=0.3)
    assert await dead.take("c", 1)
    dead._renewer.cancel()  # the replica stops renewing, as a killed one would
    alive = RedisSlots(redis_server.url, ["c"], lease_s=0.3)
    assert not await alive.take("c", 1)
    await asyncio.sleep(0.5)
    assert await alive.take("c", 1)
    await alive.aclose()


def test_queue_bounds_are_divided_exactly_among_workers(tmp_path: Path) -> None:
    cfg = _config(1, bound={"L1": 10, "L2": 3, "L3": 0})
    parts = [ConcurrencyLimits(cfg, host=(str(tmp_path / "slots"), i), workers=4).queues["c"].settings.bound
             for i in range(4)]
    for tier, total in (("L1", 10), ("L2", 3), ("L3", 0)):
        assert sum(p[tier] for p in parts) == total
    assert [p["L1"] for p in parts] == [3, 3, 2, 2]


async def test_a_reload_adds_a_limited_deployment_to_the_redis_leases(redis_server) -> None:
    """extproc/live/reload.py: a deployment that gains `max_inflight` in a reload is leased in Redis like the
    others, across replicas; one that loses it keeps its leases until its calls end."""
    from contracts.config import parse_config

    def config(limited: tuple[str, ...]):
        deps = [{"cluster": c, "protocol": "openai", "endpoints": ["127.0.0.1:9"],
                 **({"max_inflight": 1} if c in limited else {})} for c in ("c", "d")]
        return parse_config({"models": [{"name": "m", "deployments": deps}],
                             "tenants": [{"name": "t", "api_keys": ["0" * 64]}]})

    url = redis_server.url
    r0, r1 = ConcurrencyLimits(config(("c",)), redis_url=url), ConcurrencyLimits(config(("c",)), redis_url=url)
    held_c = await r0.acquire("c", "m", "t", "L3")
    assert held_c is not None
    for r in (r0, r1):
        r.apply(r.plan(config(("d",))))
    assert "d" in r0 and "c" not in r0
    a = await r0.acquire("d", "m", "t", "L3")
    waiting = asyncio.ensure_future(r1.acquire("d", "m", "t", "L3"))
    await asyncio.sleep(0.1)
    assert a is not None and not waiting.done()  # one slot across both replicas, through Redis
    a.release()
    slot = await asyncio.wait_for(waiting, 5)
    assert slot is not None
    slot.release()
    held_c.release()  # the removed deployment's lease goes back to Redis, without an error
    assert r0.shared is not None and r0.shared.held("c") == 0
    await r0.close()
    await r1.close()
