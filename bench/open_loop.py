"""Open-loop load: calls sent at a fixed rate whether or not earlier ones have answered, as real
callers arrive (wrk is closed-loop: each connection waits for its answer, so a slow gateway is
offered less). Each call's latency counts from when it was due, not from when it went out, so a
client that fell behind does not hide the gateway's queueing (coordinated omission).

bench/bench_peers.py runs it against each gateway and the upstream itself at the same rate: a
gateway's added latency is its p50 and p99 less the direct ones, the way TensorZero publishes its
gateway overhead.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from bench.outcomes import Tally


@dataclass
class OpenLoopResult:
    tally: Tally
    rate: float  # calls per second offered
    latencies_ms: list[float] = field(default_factory=list)  # answered 200s, from when each was due
    behind_ms: float = 0.0  # how late the client sent its last call (its own lag: large means the figures are not the gateway's)

    def percentile(self, q: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        if len(self.latencies_ms) == 1:
            return self.latencies_ms[0]
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(q) - 1]


async def _open_loop(url: str, body: bytes, headers: dict[str, str], rate: float, seconds: float,
                     tally: Tally) -> OpenLoopResult:
    out = OpenLoopResult(tally, rate)
    n = max(1, int(rate * seconds))
    connector = aiohttp.TCPConnector(limit=512, keepalive_timeout=60)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(due: float) -> None:
            try:
                async with session.post(url, data=body, headers=headers) as resp:
                    await resp.read()
                    tally.add(resp.status)
                    if resp.status == 200:
                        out.latencies_ms.append((time.perf_counter() - due) * 1000)
            except (aiohttp.ClientError, TimeoutError, OSError):
                tally.add("socket error")

        start = time.perf_counter() + 0.05
        calls = []
        for i in range(n):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            calls.append(asyncio.create_task(one(due)))
        out.behind_ms = max(0.0, (time.perf_counter() - (start + (n - 1) / rate)) * 1000)
        await asyncio.gather(*calls)
    return out


def open_loop(url: str, body: str, headers: dict[str, str], rate: float, seconds: float, tally: Tally) -> OpenLoopResult:
    """`rate` calls a second to `url` for `seconds`, whatever is still unanswered."""
    return asyncio.run(_open_loop(url, body.encode(), headers, rate, seconds, tally))
