"""`modelyard ratelimit status` against a real gRPC server and a real Redis."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from contracts.config.ratelimit import parse_config
from ratelimit import Limiter, RequestContext
from ratelimit import status as rl_status

from .redis_server import free_port

LIMITS = [{"scope": "tenant", "match": "*", "rate": 0.5, "burst": 3},
          {"scope": "global", "unit": "tokens", "rate": 100, "burst": 10000}]


async def _serve(limiter: Limiter) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    rl_status.add_to_server(server, limiter)
    addr = f"127.0.0.1:{free_port()}"
    server.add_insecure_port(addr)
    await server.start()
    return server, addr


async def _exercise(limiter: Limiter) -> list[bool]:
    return [(await limiter.acquire(RequestContext("acme", "L1"), 500)).allowed for _ in range(5)]


async def _check(limiter: Limiter, capsys) -> None:
    assert await _exercise(limiter) == [True, True, True, False, False]
    server, addr = await _serve(limiter)
    try:
        s = await asyncio.to_thread(rl_status.fetch, addr)
        by_key = {b["key"]: b for b in s["buckets"]}
        assert by_key["tenant:acme:requests"]["refusals"] == 2
        assert 0 <= by_key["tenant:acme:requests"]["level"] < 1  # three taken, a little refilled
        assert by_key["global:*:tokens"]["level"] == pytest.approx(10000 - 1500, abs=60)  # refills 100/s while the test runs
        assert await asyncio.to_thread(rl_status.main, ["--address", addr]) == 0
        out = capsys.readouterr().out
        assert "tenant:acme:requests" in out and "2 refusals in the last 60s" in out
    finally:
        await server.stop(None)


async def test_status_memory_backend(capsys):
    lim = Limiter(parse_config({"limits": LIMITS}))
    await _check(lim, capsys)
    await lim.close()


async def test_status_redis_backend_reads_shared_levels(redis_server, capsys):
    cfg = parse_config({"backend": "redis", "redis": {"url": redis_server.url}, "limits": LIMITS})
    lim = Limiter(cfg)
    await _check(lim, capsys)
    # another replica charges the shared bucket: this one's status shows the Redis level
    other = Limiter(cfg)
    await other.acquire(RequestContext("bob", "L1"), 100)
    await other.acquire(RequestContext("acme", "L1"), 100)
    s = await rl_status.snapshot(lim)
    g = {b["key"]: b for b in s["buckets"]}["global:*:tokens"]
    assert g["level"] == pytest.approx(10000 - 1500 - 100, abs=60)  # refills 100/s while the test runs  # bob's decision refused nothing, charged 100
    await other.close()
    await lim.close()


def test_status_unreachable_is_an_error(capsys):
    assert rl_status.main(["--address", f"127.0.0.1:{free_port()}"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err
