"""The host's shared bucket table: the memory store's answers, exact across processes, crash-safe."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
from pathlib import Path

from contracts.config.ratelimit import parse_config
from ratelimit import Limiter, RequestContext
from ratelimit.backend import MemoryBuckets
from ratelimit.bucket import NANO, BucketParams
from ratelimit.host_buckets import HostBuckets
from ratelimit.rules import Charge

P = BucketParams.of(rate=5, burst=5)
BIG = BucketParams.of(rate=5, burst=50)


def _charge(key: str, cost: int = 1, params: BucketParams = P) -> Charge:
    return Charge(key, "tenant", "requests", params, cost * NANO)


def test_same_answers_as_the_memory_store(tmp_path: Path) -> None:
    rnd = random.Random(7)
    host, mem = HostBuckets(tmp_path / "b", slots=64), MemoryBuckets()
    now = 0
    for _ in range(2000):
        now += rnd.randrange(0, 300_000)
        charges = [_charge(f"k{rnd.randrange(6)}", rnd.randrange(0, 3)) for _ in range(rnd.randrange(1, 4))]
        a, b = host.take_now(charges, now), mem.take_now(charges, now)
        assert a == b
        if rnd.random() < 0.2:
            items = [(charges[0], rnd.randrange(-2, 3) * NANO)]
            host.adjust_now(items, now)
            mem.adjust_now(items, now)
    for k in (f"k{i}" for i in range(6)):
        assert host.level(k) == mem.level(k)


def test_a_second_opener_sees_the_same_buckets(tmp_path: Path) -> None:
    a, b = HostBuckets(tmp_path / "b"), HostBuckets(tmp_path / "b")
    assert [a.take_now([_charge("t")], 0).allowed for _ in range(5)] == [True] * 5
    assert not b.take_now([_charge("t")], 0).allowed  # the burst is spent, whoever asks
    assert b.take_now([_charge("t")], 200_000).allowed  # one refilled after 1/5 s


def test_full_probe_window_reuses_the_oldest_slot(tmp_path: Path) -> None:
    t = HostBuckets(tmp_path / "b", slots=4)
    for i in range(4):
        t.take_now([_charge(f"k{i}")], i)
    t.take_now([_charge("new")], 10)  # every slot taken: k0's (touched first) goes
    assert t.level("k0") is None and t.level("new") is not None
    assert t.level("k3") is not None


def _hammer(path: str, tries: int, out: multiprocessing.Queue) -> None:
    t = HostBuckets(path, clock=lambda: 1_000_000)  # a frozen clock: nothing refills
    charges = [_charge("shared", params=BIG), _charge("other", 0)]
    out.put(sum(t.take_now(charges).allowed for _ in range(tries)))


def test_exact_across_processes(tmp_path: Path) -> None:
    """Four processes race for one bucket of burst 50 with no refill: exactly 50 get through."""
    path = str(tmp_path / "b")
    HostBuckets(path)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(path, 200, out)) for _ in range(4)]
    for p in procs:
        p.start()
    admitted = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert sum(admitted) == 50, admitted


def _hold_lock_then_die(path: str, ready) -> None:
    import fcntl

    t = HostBuckets(path)
    fcntl.lockf(t._fd, fcntl.LOCK_EX)
    ready.set()
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_holding_the_lock_does_not_wedge_the_others(tmp_path: Path) -> None:
    path = str(tmp_path / "b")
    t = HostBuckets(path)
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_lock_then_die, args=(path, ready))
    p.start()
    assert ready.wait(10)
    p.join(10)
    assert p.exitcode == -signal.SIGKILL
    assert t.take_now([_charge("t")], 0).allowed


async def test_limiter_over_the_host_table(tmp_path: Path) -> None:
    cfg = parse_config({"limits": [{"scope": "tenant", "match": "*", "unit": "requests", "rate": 1, "burst": 2}]})
    a = Limiter(cfg, host_table=str(tmp_path / "b"), clock=lambda: 0)
    b = Limiter(cfg, host_table=str(tmp_path / "b"), clock=lambda: 0)
    ctx = RequestContext(tenant="acme")
    got = [(await lim.acquire(ctx)).allowed for lim in (a, b, a, b)]
    assert got == [True, True, False, False]
    d = await b.acquire(ctx)
    assert d.limited_by == "tenant:acme:requests" and b.bound_rule(ctx, d) == "tenant:*:requests"
    await a.close()
    await b.close()
