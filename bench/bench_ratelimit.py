"""Rate limit decisions per second: memory store vs the host table workers share vs Redis.

One decision covers 4 buckets (tenant, tier, cluster requests + global tokens). Redis is a real
redis-server started here on a free loopback port. Baseline: the memory store, same run.

Every decision is counted by outcome ("allowed via redis", "denied via local", ...). The limits
are far above the load, so each case declares exactly one expected outcome: allowed, by the store
it measures. A denial or a Redis case that fell back to local buckets fails the bench (`FAILED:`
line, exit status 1), and decisions/s counts the expected decisions only.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable

import orjson

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.outcomes import Tally, report  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from contracts.config.ratelimit import parse_config  # noqa: E402
from ratelimit import Limiter, RequestContext  # noqa: E402
from tests.ratelimit.redis_server import RedisServer  # noqa: E402

LIMITS = [
    {"scope": "tenant", "match": "*", "rate": 1e8, "burst": 4e6},
    {"scope": "tier", "match": "*", "rate": 1e8, "burst": 4e6},
    {"scope": "cluster", "match": "*", "rate": 1e8, "burst": 4e6},
    {"scope": "global", "unit": "tokens", "rate": 1e8, "burst": 4e6},
]
CTXS = [RequestContext(f"tenant-{i}", "L1", f"cluster-{i % 4}", "standard") for i in range(16)]
REPEATS = scaled(5, 1)


def _outcome(lim: Limiter, tally: Tally) -> Callable[[RequestContext], Awaitable[None]]:
    """acquire() that counts its decision's outcome."""

    async def acquire(ctx: RequestContext) -> None:
        d = await lim.acquire(ctx, 100)
        tally.add(f"{'allowed' if d.allowed else 'denied'} via {d.store}")
    return acquire


async def _sequential(lim: Limiter, n: int, tally: Tally) -> float:
    acquire = _outcome(lim, tally)
    ok0 = tally.ok
    t0 = time.perf_counter()
    for i in range(n):
        await acquire(CTXS[i & 15])
    return (tally.ok - ok0) / (time.perf_counter() - t0)


async def _concurrent(lim: Limiter, n: int, width: int, tally: Tally) -> float:
    acquire = _outcome(lim, tally)

    async def worker(k: int) -> None:
        for i in range(n // width):
            await acquire(CTXS[(i + k) & 15])

    ok0 = tally.ok
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(width)))
    return (tally.ok - ok0) / (time.perf_counter() - t0)


async def _median(fn, *args) -> float:
    return statistics.median([await fn(*args) for _ in range(REPEATS)])


async def run(tallies: list[Tally]) -> list[dict]:
    def case(name: str, store: str) -> Tally:
        # The one outcome this case expects: every decision allowed, by the store under test.
        tallies.append(Tally("ratelimit", name, frozenset({f"allowed via {store}"})))
        return tallies[-1]

    rows: list[dict] = []
    mem = Limiter(parse_config({"limits": LIMITS}))
    base = await _median(_sequential, mem, scaled(20_000, 500), case("memory 4 keys", "memory"))
    rows.append({"bench": "ratelimit", "case": "memory 4 keys", "metric": "decisions_per_s", "value": round(base), "unit": "1/s"})
    await mem.close()

    # The table every worker of a host maps (ratelimit/host_buckets.py): one fcntl lock per decision.
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as d:
        host = Limiter(parse_config({"limits": LIMITS}), host_table=f"{d}/buckets")
        val = await _median(_sequential, host, 20_000, case("host table 4 keys", "memory"))
        rows.append({"bench": "ratelimit", "case": "host table 4 keys", "metric": "decisions_per_s",
                     "value": round(val), "unit": "1/s"})
        await host.close()

    srv = RedisServer()
    srv.start()
    try:
        lim = Limiter(parse_config({"backend": "redis", "redis": {"url": srv.url, "timeout_ms": 1000}, "limits": LIMITS}))
        await _outcome(lim, case("redis warm-up", "redis"))(CTXS[0])  # load the script
        seq = await _median(_sequential, lim, scaled(2_000, 100), case("redis 4 keys sequential", "redis"))
        rows.append({"bench": "ratelimit", "case": "redis 4 keys sequential", "metric": "decisions_per_s", "value": round(seq), "unit": "1/s"})
        for width in (16, 64):
            name = f"redis 4 keys concurrent {width}"
            con = await _median(_concurrent, lim, scaled(4_000, 256), width, case(name, "redis"))
            rows.append({"bench": "ratelimit", "case": name, "metric": "decisions_per_s", "value": round(con), "unit": "1/s"})
        await lim.close()
    finally:
        srv.stop()
    for r in rows:
        r["baseline"] = round(base)
        r["ratio"] = round(r["value"] / base, 4)
    return rows


def main() -> int:
    tallies: list[Tally] = []
    rows = asyncio.run(run(tallies))
    print(f"{'case':<30} {'decisions/s':>12} {'vs memory':>10}")
    for r in rows:
        print(f"{r['case']:<30} {r['value']:>12,} {r['ratio']:>10.3f}")
    print("SUMMARY " + orjson.dumps(rows).decode())
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(main())
