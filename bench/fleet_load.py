"""The replica benchmark's workload and open-loop client (bench_replicas.py drives them).

Workload: conversations on a handful of long shared system prompts (Zipf-chosen), each turn a
user message of uneven length (log-normal) and the whole history before it, answers of uneven
length (`max_tokens`). Arrivals are Poisson at a fixed rate (open loop: a slow server does not slow
the arrivals); an arrival continues an idle conversation (its next turn, the answer it got
included) or starts a new one. The same seed gives the same sequence of prompts to every strategy.

The client streams every call (aiohttp) and records the time to the first content chunk (TTFT),
the output tokens (the simulated server's tokens are " t") and the end.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

CHARS_PER_TOKEN = 4  # as the simulated server counts
WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
         "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
         "xray", "yankee", "zulu"]


def text_of(rng: random.Random, tokens: int) -> str:
    out: list[str] = []
    n = 0
    while n < tokens * CHARS_PER_TOKEN:
        w = rng.choice(WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[: tokens * CHARS_PER_TOKEN]


@dataclass(frozen=True)
class WorkloadSpec:
    system_tokens: tuple[int, ...] = (2400, 1800, 3000, 1200, 2000, 2600, 1500, 2200)
    zipf_s: float = 0.8
    user_median_tokens: int = 160
    user_sigma: float = 1.0  # log-normal spread: most short, a few of a thousand tokens or more
    user_max_tokens: int = 2000
    output_tokens: tuple[int, ...] = (24, 48, 96, 160, 256)
    max_turns: int = 4
    new_share: float = 0.4  # arrivals that start a conversation when an idle one could continue


@dataclass
class Conversation:
    system: int
    messages: list[dict[str, str]]
    turns: int = 0
    busy: bool = False


@dataclass
class Result:
    sent_at: float
    ttft: float | None = None
    end: float | None = None
    tokens: int = 0
    status: int = 0
    error: str = ""
    marks: list[tuple[float, int]] = field(default_factory=list)  # (when, tokens) per content chunk


@dataclass
class LoadRun:
    results: list[Result] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    duration: float = 0.0  # how long arrivals lasted

    def steady_tok_s(self) -> float:
        """Output tokens received while arrivals lasted, past the first quarter (the batches filling):
        the fleet's rate in steady state. tokens / wall also counts the drain after the last arrival,
        whose longest answer takes as long whoever routed it, so it caps every router near the
        offered load x duration / (duration + that answer's decode) and hides a saturated fleet."""
        lo, hi = self.started + self.duration / 4, self.started + self.duration
        n = sum(k for r in self.results for t, k in r.marks if lo <= t < hi)
        return n / (hi - lo) if hi > lo else math.nan

    def summary(self) -> dict[str, Any]:
        ok = [r for r in self.results if r.status == 200 and r.ttft is not None and not r.error]
        ttfts = sorted(r.ttft for r in ok if r.ttft is not None)
        wall = max(1e-9, self.finished - self.started)
        return {"requests": len(self.results), "ok": len(ok), "errors": len(self.results) - len(ok),
                "ttft_p50_ms": pct(ttfts, 50) * 1000, "ttft_p99_ms": pct(ttfts, 99) * 1000,
                "ttft_mean_ms": (statistics.fmean(ttfts) * 1000) if ttfts else math.nan,
                "output_tok_s": sum(r.tokens for r in ok) / wall, "wall_s": wall,
                "steady_tok_s": self.steady_tok_s(),
                "first_errors": sorted({f"{r.status} {r.error}"[:160] for r in self.results if r not in ok})[:3]}


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return math.nan
    k = min(len(xs) - 1, max(0, math.ceil(p / 100 * len(xs)) - 1))
    return xs[k]


class Workload:
    def __init__(self, spec: WorkloadSpec, seed: int) -> None:
        self.spec = spec
        # One generator per decision: whether a call continues an idle conversation depends on timing
        # (which answers are in), and with one shared stream every later length and answer size
        # shifted with it; now the i-th call's sizes are the same for every strategy (same tokens).
        self.rng = random.Random(seed)  # continue or start, and which conversation
        self.len_rng = random.Random(seed + 7)
        self.out_rng = random.Random(seed + 13)
        srng = random.Random(1234)  # the system prompts are the same text in every run
        self.systems = [f"System prompt {i}. " + text_of(srng, n) for i, n in enumerate(spec.system_tokens)]
        weights = [1 / (i + 1) ** spec.zipf_s for i in range(len(self.systems))]
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.convs: list[Conversation] = []

    def next_call(self) -> tuple[Conversation, int]:
        """The next call: its conversation (messages include the new user turn) and max_tokens."""
        s, rng = self.spec, self.rng
        idle = [c for c in self.convs if not c.busy]
        if rng.random() >= s.new_share and idle:
            conv = rng.choice(idle)
        else:
            sysi = rng.choices(range(len(self.systems)), self.weights)[0]
            conv = Conversation(sysi, [{"role": "system", "content": self.systems[sysi]}])
            self.convs.append(conv)
        n = min(s.user_max_tokens, max(8, int(self.len_rng.lognormvariate(math.log(s.user_median_tokens),
                                                                           s.user_sigma))))
        conv.messages.append({"role": "user", "content": text_of(self.len_rng, n)})
        conv.busy = True
        return conv, self.out_rng.choice(s.output_tokens)

    def answered(self, conv: Conversation, tokens: int) -> None:
        conv.busy = False
        conv.turns += 1
        conv.messages.append({"role": "assistant", "content": " t" * tokens})
        if conv.turns >= self.spec.max_turns:
            self.convs.remove(conv)


async def _one(session: aiohttp.ClientSession, url: str, headers: dict[str, str], model: str,
               conv: Conversation, max_tokens: int, res: Result, timeout_s: float) -> None:
    body = orjson.dumps({"model": model, "messages": conv.messages, "max_tokens": max_tokens, "stream": True})
    try:
        async with session.post(url, data=body, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = (await resp.text())[:200]
                return
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    data = orjson.loads(event[6:])
                    for c in data.get("choices") or ():
                        piece = (c.get("delta") or {}).get("content") or c.get("text") or ""
                        if piece:
                            now = time.monotonic()
                            if res.ttft is None:
                                res.ttft = now - res.sent_at
                            n = piece.count(" t")
                            res.tokens += n
                            res.marks.append((now, n))
            res.end = time.monotonic()
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"


async def open_loop(url: str, model: str, rate: float, duration_s: float, seed: int,
                    spec: WorkloadSpec = WorkloadSpec(), headers: dict[str, str] | None = None,
                    timeout_s: float = 120.0) -> LoadRun:
    """Poisson arrivals at `rate` per second for `duration_s`, then wait for every call to end."""
    wl = Workload(spec, seed)
    arrivals = random.Random(seed + 1)
    run = LoadRun()
    hdrs = {"content-type": "application/json", **(headers or {})}
    tasks: list[asyncio.Task[None]] = []
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn) as session:
        loop = asyncio.get_running_loop()
        run.started = t = loop.time()
        start_mono = time.monotonic()
        while t - run.started < duration_s:
            await asyncio.sleep(max(0.0, t - loop.time()))
            conv, max_tokens = wl.next_call()
            res = Result(time.monotonic())
            run.results.append(res)

            async def call(conv: Conversation = conv, max_tokens: int = max_tokens, res: Result = res) -> None:
                await _one(session, url, hdrs, model, conv, max_tokens, res, timeout_s)
                wl.answered(conv, res.tokens or max_tokens)

            tasks.append(asyncio.create_task(call()))
            t += arrivals.expovariate(rate)
        await asyncio.gather(*tasks)
    run.started = start_mono
    run.duration = duration_s
    run.finished = max((r.end or r.sent_at) for r in run.results) if run.results else start_mono
    return run
