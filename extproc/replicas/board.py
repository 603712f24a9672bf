"""The Gateway's replica part: background pollers of every endpoint's model-server metrics, and
per deployment the gateway's own in-flight calls, recent failures and prefix index.

The request path calls `pick` (synchronous, no I/O: it reads the last readings) and reports the
call's start and end; the pollers run as asyncio tasks, one per endpoint, each with at most one
poll in flight and a timeout, so a dead replica costs one task that waits, never a request.
A poll that fails keeps the old reading, which goes stale, and the picker then fails open.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from contracts.config import Deployment, GatewayConfig
from contracts.config.balancing import ReplicaMetrics
from extproc.replicas.exposition import MetricsParseError
from extproc.replicas.picker import Pick, pick_replica
from extproc.replicas.prefix import PrefixIndex, block_hashes
from extproc.replicas.readings import ReplicaReading, parse_replica_metrics
from extproc.replicas.scrape import MetricsScrape
from extproc.shutdown import stop_polling
from extproc.telemetry.metrics import REPLICA_PICKS, REPLICA_POLL_ERRORS, REPLICA_STATES, ReplicaState

log = logging.getLogger(__name__)


@dataclass
class ReplicaSet:
    """One deployment's replicas as the picker sees them."""

    cluster: str
    endpoints: list[str]
    settings: ReplicaMetrics
    readings: dict[str, ReplicaReading] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    failed_at: dict[str, float] = field(default_factory=dict)
    prefix: PrefixIndex = field(init=False)

    def __post_init__(self) -> None:
        self.prefix = PrefixIndex(self.settings.prefix_entries, self.settings.prefix_ways)

    def retune(self, settings: ReplicaMetrics) -> None:
        """A reload that keeps the endpoints: new weights and settings from the next pick on, with the
        readings, in-flight counts and failure holds kept (the pollers read the settings each round)."""
        old, self.settings = self.settings, settings
        if (old.block_chars, old.prefix_blocks) != (settings.block_chars, settings.prefix_blocks):
            self.prefix = PrefixIndex(settings.prefix_entries, settings.prefix_ways)  # other blocks: never match
        else:
            self.prefix.max_entries = settings.prefix_entries
            self.prefix.ways = settings.prefix_ways

    def metrics_url(self, endpoint: str) -> str:
        host, _, port = endpoint.rpartition(":")
        return f"http://{host}:{self.settings.port or port}{self.settings.path}"

    def metrics_target(self, endpoint: str) -> tuple[str, int, str]:
        """(host, port, path) of `metrics_url`."""
        host, _, port = endpoint.rpartition(":")
        return host.strip("[]"), int(self.settings.port or port), self.settings.path


@dataclass(frozen=True, slots=True)
class Sent:
    """A call the picker placed: what `done` needs to give back."""

    cluster: str
    endpoint: str


class ReplicaBoard:
    def __init__(self, deployments: list[Deployment], clock: Callable[[], float] = time.monotonic) -> None:
        self.sets: dict[str, ReplicaSet] = {}
        self._clock = clock
        self._started = False
        # Per endpoint: its kept-open scrape, and the last body with the reading parsed from it
        # (an unchanged exposition, the common case between two polls 50 ms apart, is not parsed again).
        self._scrapes: dict[tuple[str, str], MetricsScrape] = {}
        self._last: dict[tuple[str, str], tuple[str, bytes, ReplicaReading]] = {}
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._errors: dict[tuple[str, str], str] = {}
        self.reconfigure(deployments)

    @classmethod
    def from_config(cls, config: GatewayConfig) -> ReplicaBoard | None:
        """None when no deployment reads its replicas: the request path then does no work at all."""
        deps = [d for d in config.clusters().values() if d.replica_metrics is not None]
        return cls(deps) if deps else None

    # -- the request path ------------------------------------------------------------------
    def pick(self, cluster: str, *, adapter: str | None = None, prompt: str | None = None,
             among: list[str] | None = None) -> tuple[Pick, list[bytes]]:
        """`among`: only these of the set's endpoints (the endpoint picker's subset hint)."""
        rs = self.sets[cluster]
        s = rs.settings
        hashes = block_hashes(prompt, s.block_chars, s.prefix_blocks) if prompt and s.prefix_blocks else []
        pick = pick_replica(s, rs.endpoints if among is None else among, rs.readings, rs.in_flight, rs.failed_at,
                            self._clock(), adapter=adapter, prefix_depth=rs.prefix.match(hashes) if hashes else None,
                            prefix_blocks=len(hashes), prefix_key=hashes[0] if hashes else b"")
        REPLICA_PICKS.labels(cluster, pick.endpoint or "").inc()
        return pick, hashes

    def sent(self, cluster: str, endpoint: str, hashes: list[bytes]) -> Sent:
        rs = self.sets[cluster]
        rs.in_flight[endpoint] = rs.in_flight.get(endpoint, 0) + 1
        if hashes:
            rs.prefix.record(hashes, endpoint)
        return Sent(cluster, endpoint)

    def done(self, sent: Sent, *, failed: bool) -> None:
        rs = self.sets.get(sent.cluster)
        if rs is None:  # reconfigured away meanwhile
            return
        left = rs.in_flight.get(sent.endpoint, 0) - 1
        if left > 0:
            rs.in_flight[sent.endpoint] = left
        else:
            rs.in_flight.pop(sent.endpoint, None)
        if failed:
            rs.failed_at[sent.endpoint] = self._clock()

    def mark_failed(self, cluster: str, endpoint: str) -> None:
        """A failure seen on an endpoint other than the one `sent` names (a proxy's retry went on)."""
        rs = self.sets.get(cluster)
        if rs is not None and endpoint in rs.endpoints:
            rs.failed_at[endpoint] = self._clock()

    def states(self) -> Iterator[ReplicaState]:
        """What the picker reads per endpoint now (`modelyard_replica_state`, scraped)."""
        now = self._clock()
        for cluster, rs in list(self.sets.items()):
            hold = rs.settings.failure_hold_ms / 1000.0
            for ep in rs.endpoints:
                fields: dict[str, float] = {"in_flight": rs.in_flight.get(ep, 0)}
                failed = rs.failed_at.get(ep)
                if failed is not None and now - failed < hold:
                    fields["held_seconds"] = hold - (now - failed)
                r = rs.readings.get(ep)
                if r is not None:
                    fields.update(waiting=r.waiting, running=r.running, age_seconds=max(0.0, now - r.at))
                    if r.kv_usage is not None:
                        fields["kv_usage"] = r.kv_usage
                    if r.max_lora is not None:
                        fields["max_lora"] = r.max_lora
                yield cluster, ep, fields, r.loras if r is not None else frozenset()

    # -- background --------------------------------------------------------------------------
    def reconfigure(self, deployments: list[Deployment]) -> None:
        """A reload: a deployment whose endpoints are unchanged keeps its state and pollers and takes
        its new settings (weights included) at once; the rest start afresh."""
        self.reconfigure_sets({d.cluster: (list(d.endpoints), d.replica_metrics) for d in deployments
                               if d.replica_metrics is not None})

    def reconfigure_sets(self, wanted: dict[str, tuple[list[str], ReplicaMetrics]], *,
                         keep_members: bool = False) -> None:
        """cluster -> (endpoints, settings). `keep_members`: a set whose endpoints change keeps the
        remaining ones' state (the endpoint picker's pool, extproc/epp, where pods come and go)."""
        for cluster in list(self.sets):
            w = wanted.get(cluster)
            rs = self.sets[cluster]
            if w is None or (w[0] != rs.endpoints and not keep_members):
                del self.sets[cluster]
                for key in [k for k in self._tasks if k[0] == cluster]:
                    self._tasks.pop(key).cancel()
                    self._forget(key)
                continue
            if w[1] != rs.settings:
                rs.retune(w[1])
            if w[0] != rs.endpoints:
                gone = set(rs.endpoints) - set(w[0])
                rs.endpoints = list(w[0])
                for ep in gone:
                    task = self._tasks.pop((cluster, ep), None)
                    if task is not None:
                        task.cancel()
                    self._forget((cluster, ep))
                    rs.readings.pop(ep, None)
                    rs.failed_at.pop(ep, None)
        for cluster, (endpoints, settings) in wanted.items():
            if cluster not in self.sets:
                self.sets[cluster] = ReplicaSet(cluster, list(endpoints), settings)
            for ep in endpoints:
                REPLICA_POLL_ERRORS.labels(cluster, ep)  # a zero series from the start
        if self._started:
            self._start_missing()

    def _forget(self, key: tuple[str, str]) -> None:
        scrape = self._scrapes.pop(key, None)
        if scrape is not None:
            scrape.close()
        self._last.pop(key, None)

    async def poll_once(self, rs: ReplicaSet, endpoint: str) -> ReplicaReading | None:
        s = rs.settings
        key = (rs.cluster, endpoint)
        try:
            target = rs.metrics_target(endpoint)
            scrape = self._scrapes.get(key)
            if scrape is None or (scrape.host, scrape.port, scrape.path) != target:
                if scrape is not None:
                    scrape.close()
                scrape = self._scrapes[key] = MetricsScrape(*target)
            async with asyncio.timeout(max(s.stale_after_s, 0.05)):
                status, body = await scrape.get()
            if status != 200:
                raise MetricsParseError(f"HTTP {status}")
            now = self._clock()
            last = self._last.get(key)
            if last is not None and last[0] == s.kind and last[1] == body:
                reading = replace(last[2], at=now)
            else:
                reading = parse_replica_metrics(s.kind, body, now)
                self._last[key] = (s.kind, body, reading)
        except (TimeoutError, MetricsParseError, OSError, ValueError) as e:
            REPLICA_POLL_ERRORS.labels(rs.cluster, endpoint).inc()
            msg = f"{type(e).__name__}: {e}"
            if self._errors.get((rs.cluster, endpoint)) != msg:  # log changes, not every failed poll
                log.warning("replica metrics %s %s: %s", rs.cluster, endpoint, msg)
                self._errors[(rs.cluster, endpoint)] = msg
            return None
        self._errors.pop((rs.cluster, endpoint), None)
        if self.sets.get(rs.cluster) is rs:
            rs.readings[endpoint] = reading
        return reading

    async def _run(self, rs: ReplicaSet, endpoint: str) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.poll_once(rs, endpoint)
            interval = rs.settings.interval_ms / 1000.0
            # Fixed cadence: a slow poll shortens the next wait instead of drifting.
            next_at += interval
            delay = next_at - loop.time()
            if delay < 0:
                next_at, delay = loop.time(), 0.0
            await asyncio.sleep(delay)

    def _start_missing(self) -> None:
        for cluster, rs in self.sets.items():
            for ep in rs.endpoints:
                if (cluster, ep) not in self._tasks:
                    self._tasks[(cluster, ep)] = asyncio.create_task(self._run(rs, ep), name=f"replica:{cluster}:{ep}")

    async def start(self, first_poll_timeout: float | None = None) -> None:
        self._started = True
        REPLICA_STATES.source = self.states  # one board per process: its state is what /metrics shows
        if first_poll_timeout:
            polls = [self.poll_once(rs, ep) for rs in self.sets.values() for ep in rs.endpoints]
            try:
                await asyncio.wait_for(asyncio.gather(*polls), first_poll_timeout)
            except TimeoutError:
                log.warning("replica metrics: first poll round took over %.1fs", first_poll_timeout)
        self._start_missing()

    async def stop(self) -> None:
        await stop_polling(self._tasks.values(), None)
        self._tasks = {}
        self._started = False
        for key in list(self._scrapes):
            self._forget(key)
