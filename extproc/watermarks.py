"""GPU watermarks: pure parsers for agent JSON and DCGM exporter text, and background pollers.

A watermark is the busiest GPU's pressure, max over GPUs of max(util, memory used fraction),
in [0, 1]. `WatermarkBoard` polls every configured source in the background and keeps the last
`Reading` per cluster in a plain dict; the request path reads that dict synchronously and never
waits on a poll. Readings carry the monotonic time they arrived so the scheduler can treat an old
reading as saturated.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp
import orjson

from extproc.config import GatewayConfig, WatermarkSource

log = logging.getLogger(__name__)


class WatermarkParseError(ValueError):
    """A watermark source answered with something that is not a usable reading."""

    status = 502


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    util: float  # percent, 0..100, as NVML and DCGM report it
    mem_used: float
    mem_total: float

    @property
    def pressure(self) -> float:
        mem = self.mem_used / self.mem_total if self.mem_total > 0 else 0.0
        return max(self.util / 100.0, mem)


@dataclass(frozen=True, slots=True)
class Reading:
    """One watermark observation; `ts` is the monotonic clock when it arrived."""

    watermark: float
    ts: float
    gpus: tuple[GpuReading, ...] = ()
    source: str = "agent"
    # The source itself says it is saturated (not used for staleness: the scheduler checks `ts`).
    saturated: bool = False

    def age(self, now: float) -> float:
        return now - self.ts


def effective(reading: Reading | None, now: float, stale_after_s: float) -> Reading:
    """The reading as routing sees it: missing or older than `stale_after_s` is saturated (1.0)."""
    if reading is None:
        return Reading(1.0, now, source="none", saturated=True)
    if now - reading.ts > stale_after_s:
        return Reading(1.0, reading.ts, reading.gpus, reading.source, saturated=True)
    return reading


def watermark_of(gpus: tuple[GpuReading, ...] | list[GpuReading]) -> float:
    return min(1.0, max((g.pressure for g in gpus), default=0.0))


def _number(v: object, where: str, lo: float, hi: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WatermarkParseError(f"{where}: expected a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or f < lo or f > hi:
        raise WatermarkParseError(f"{where}: {v!r} is outside [{lo}, {hi}]")
    return f


def parse_agent_json(body: bytes | str, now: float = 0.0) -> Reading:
    """Parse `GET /watermarks` of `modelyard agent`. The watermark is recomputed from `gpus`
    when present (the agent's own `watermark` is used only when it lists no GPUs)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise WatermarkParseError(f"agent watermarks: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise WatermarkParseError("agent watermarks: expected a JSON object")
    raw = doc.get("gpus", [])
    if not isinstance(raw, list):
        raise WatermarkParseError("agent watermarks: gpus must be a list")
    gpus = []
    for i, g in enumerate(raw):
        if not isinstance(g, dict):
            raise WatermarkParseError(f"agent watermarks: gpus[{i}] must be an object")
        idx = g.get("index", i)
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise WatermarkParseError(f"agent watermarks: gpus[{i}].index must be an integer")
        total = _number(g.get("mem_total"), f"gpus[{i}].mem_total", 0, 1e18)
        gpus.append(
            GpuReading(
                index=idx,
                util=_number(g.get("util"), f"gpus[{i}].util", 0, 100),
                mem_used=_number(g.get("mem_used"), f"gpus[{i}].mem_used", 0, max(total, 0)),
                mem_total=total,
            )
        )
    if gpus:
        wm = watermark_of(gpus)
    elif "watermark" in doc:
        wm = _number(doc["watermark"], "agent watermarks: watermark", 0, 1)
    else:
        raise WatermarkParseError("agent watermarks: neither gpus nor watermark present")
    source = doc.get("source", "agent")
    return Reading(wm, now, tuple(gpus), source if isinstance(source, str) else "agent")


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_DCGM = {"DCGM_FI_DEV_GPU_UTIL": "util", "DCGM_FI_DEV_FB_USED": "used", "DCGM_FI_DEV_FB_FREE": "free"}


def _labels(text: str, lineno: int) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None or m.end() == pos:
            if text[pos:].strip() in ("", ","):
                break
            raise WatermarkParseError(f"dcgm metrics line {lineno}: bad labels")
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


def parse_dcgm_metrics(text: bytes | str, now: float = 0.0) -> Reading:
    """Parse a DCGM exporter's Prometheus text: GPU_UTIL (percent), FB_USED and FB_FREE (MiB),
    one series per GPU (label `gpu`, else `UUID`); other metrics are ignored."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    per_gpu: dict[str, dict[str, float]] = {}
    order: list[str] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#") or not line.startswith("DCGM_FI_DEV_"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: not a sample")
        kind = _DCGM.get(m.group(1))
        if kind is None:
            continue
        labels = _labels(m.group(2) or "", lineno)
        key = labels.get("gpu") or labels.get("UUID") or "0"
        try:
            value = float(m.group(3))
        except ValueError:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: bad value") from None
        if not math.isfinite(value) or value < 0:
            raise WatermarkParseError(f"dcgm metrics line {lineno}: {m.group(3)} out of range")
        if key not in per_gpu:
            per_gpu[key] = {}
            order.append(key)
        per_gpu[key][kind] = value
    if not per_gpu:
        raise WatermarkParseError("dcgm metrics: no DCGM_FI_DEV_GPU_UTIL / FB_USED / FB_FREE")
    gpus = []
    for i, key in enumerate(order):
        v = per_gpu[key]
        used, free = v.get("used", 0.0), v.get("free", 0.0)
        gpus.append(
            GpuReading(
                index=int(key) if key.isdigit() else i,
                util=min(100.0, v.get("util", 0.0)),
                mem_used=used,
                mem_total=used + free,
            )
        )
    return Reading(watermark_of(gpus), now, tuple(gpus), "dcgm")


def parse_reading(kind: str, body: bytes, now: float) -> Reading:
    if kind == "dcgm":
        return parse_dcgm_metrics(body, now)
    return parse_agent_json(body, now)


@dataclass
class WatermarkPoller:
    """Polls one source every `interval_s`; `reading` is the last good one (None before)."""

    cluster: str
    source: WatermarkSource
    interval_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    reading: Reading | None = None
    errors: int = 0
    last_error: str | None = None
    _updated: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def poll_once(self, session: aiohttp.ClientSession) -> Reading | None:
        try:
            timeout = aiohttp.ClientTimeout(total=self.interval_s)
            async with session.get(self.source.url, timeout=timeout) as resp:
                if resp.status != 200:
                    raise WatermarkParseError(f"HTTP {resp.status}")
                body = await resp.read()
            reading = parse_reading(self.source.kind, body, self.clock())
        except (aiohttp.ClientError, asyncio.TimeoutError, WatermarkParseError, OSError) as e:
            self.errors += 1
            msg = f"{type(e).__name__}: {e}"
            if msg != self.last_error:  # log changes, not every failed poll
                log.warning("watermark %s (%s): %s", self.cluster, self.source.url, msg)
            self.last_error = msg
            return None
        self.reading, self.last_error = reading, None
        self._updated.set()
        self._updated = asyncio.Event()
        return reading

    async def wait_for_update(self, timeout: float) -> Reading | None:
        """Wait for the next successful poll (tests and readiness checks)."""
        try:
            await asyncio.wait_for(self._updated.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        return self.reading

    async def run(self, session: aiohttp.ClientSession, on_reading: Callable[[str, Reading], None]) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            r = await self.poll_once(session)
            if r is not None:
                on_reading(self.cluster, r)
            # Fixed cadence: a slow poll shortens the next wait instead of drifting.
            next_at += self.interval_s
            delay = next_at - loop.time()
            if delay < 0:
                next_at, delay = loop.time(), 0
            await asyncio.sleep(delay)


class WatermarkBoard:
    """Background pollers for every cluster with a watermark source; `readings` is the live map
    handed to `Scheduler.decide` (updated in place on the event loop, read synchronously)."""

    def __init__(
        self,
        sources: Mapping[str, WatermarkSource],
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pollers = {c: WatermarkPoller(c, s, interval_s, clock) for c, s in sources.items()}
        self.readings: dict[str, Reading] = {}
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def from_config(cls, config: GatewayConfig, interval_s: float = 1.0) -> "WatermarkBoard":
        sources = {c: d.watermark for c, d in config.clusters().items() if d.watermark is not None}
        return cls(sources, interval_s)

    def _store(self, cluster: str, reading: Reading) -> None:
        self.readings[cluster] = reading

    async def start(self, first_poll_timeout: float | None = None) -> None:
        """Start polling; with `first_poll_timeout`, wait (bounded) for one round first so the
        gateway does not start with every monitored deployment counted as saturated."""
        self._session = aiohttp.ClientSession()
        if first_poll_timeout and self.pollers:
            polls = [p.poll_once(self._session) for p in self.pollers.values()]
            try:
                done = await asyncio.wait_for(asyncio.gather(*polls), first_poll_timeout)
            except asyncio.TimeoutError:
                log.warning("watermarks: first poll round took over %.1fs", first_poll_timeout)
            else:
                for p, r in zip(self.pollers.values(), done):
                    if r is not None:
                        self._store(p.cluster, r)
        self._tasks = [
            asyncio.create_task(p.run(self._session, self._store), name=f"watermark:{p.cluster}")
            for p in self.pollers.values()
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    close = stop  # the gateway closes its parts with `close()`
