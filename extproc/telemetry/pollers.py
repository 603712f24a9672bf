"""Background watermark pollers: one per monitored cluster, HTTP GET on a fixed cadence.

`WatermarkBoard` polls every configured source and keeps the last `Reading` per cluster in a plain
dict; the request path reads that dict synchronously and never waits on a poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from contracts.config import GatewayConfig, WatermarkSource
from contracts.watermarks import Reading, WatermarkParseError
from extproc.routing.watermarks import parse_reading
from extproc.shutdown import stop_polling
from extproc.telemetry.metrics import WATERMARK_POLL_ERRORS, WATERMARK_READ_AT

log = logging.getLogger(__name__)


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
        except (TimeoutError, aiohttp.ClientError, WatermarkParseError, OSError) as e:
            self.errors += 1
            WATERMARK_POLL_ERRORS.labels(self.cluster).inc()
            msg = f"{type(e).__name__}: {e}"
            if msg != self.last_error:  # log changes, not every failed poll
                log.warning("watermark %s (%s): %s", self.cluster, self.source.url, msg)
            self.last_error = msg
            return None
        self.reading, self.last_error = reading, None
        WATERMARK_READ_AT.labels(self.cluster).set_to_current_time()
        self._updated.set()
        self._updated = asyncio.Event()
        return reading

    async def wait_for_update(self, timeout: float) -> Reading | None:
        """Wait for the next successful poll (tests and readiness checks)."""
        try:
            await asyncio.wait_for(self._updated.wait(), timeout)
        except TimeoutError:
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
        for cluster in self.pollers:
            WATERMARK_POLL_ERRORS.labels(cluster)  # a zero series from the start, so rate() has a base
        self.readings: dict[str, Reading] = {}
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._running: dict[str, asyncio.Task[None]] = {}

    @classmethod
    def from_config(cls, config: GatewayConfig, interval_s: float = 1.0) -> WatermarkBoard:
        sources = {c: d.watermark for c, d in config.clusters().items() if d.watermark is not None}
        return cls(sources, interval_s)

    def reconfigure(self, sources: Mapping[str, WatermarkSource], interval_s: float) -> None:
        """A reload: a poller whose source is unchanged keeps running (and its last reading); a removed
        or changed one stops; a new one starts now when the board runs."""
        for cluster in [c for c, p in self.pollers.items() if sources.get(c) != p.source]:
            self.pollers.pop(cluster)
            self.readings.pop(cluster, None)
            task = self._running.pop(cluster, None)
            if task is not None:
                task.cancel()
        for cluster, source in sources.items():
            if cluster in self.pollers:
                self.pollers[cluster].interval_s = interval_s  # read before each wait
                continue
            p = self.pollers[cluster] = WatermarkPoller(cluster, source, interval_s, self._clock)
            WATERMARK_POLL_ERRORS.labels(cluster)
            if self._session is not None:
                self._running[cluster] = asyncio.create_task(p.run(self._session, self._store),
                                                             name=f"watermark:{cluster}")

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
            except TimeoutError:
                log.warning("watermarks: first poll round took over %.1fs", first_poll_timeout)
            else:
                for p, r in zip(self.pollers.values(), done):
                    if r is not None:
                        self._store(p.cluster, r)
        self._running = {
            c: asyncio.create_task(p.run(self._session, self._store), name=f"watermark:{c}")
            for c, p in self.pollers.items()
        }

    async def stop(self) -> None:
        await stop_polling(self._running.values(), self._session)
        self._running, self._session = {}, None

    close = stop  # the gateway closes its parts with `close()`
