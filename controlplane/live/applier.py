"""The apply path: one new config to Envoy and every extproc, in an order that loses no request.

1. Envoy gets the new config plus whatever it removes (snapshot.bridge): new clusters exist before
   any extproc routes to them, removed ones survive while an extproc may still route to them.
   Wait for every Envoy's ACK; a NACK puts the last good config back and fails the apply (422).
2. The extprocs get the new text over the long poll; wait for every live worker's ack.
3. Envoy drops what was removed (when something was).
Each wait is bounded by the apply's timeout (504: who did not confirm). Applies run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import ConfigError
from contracts.live_config import config_version
from controlplane.environments import EnvironmentConfig
from controlplane.live.ads import AdsService
from controlplane.live.ledger import Ledger
from controlplane.live.snapshot import Snapshot, bridge
from controlplane.live.subscribers import Subscribers
from controlplane.live.validation import Candidate, candidate, restart_only

log = logging.getLogger("modelyard.controlplane")
HISTORY = 20  # applies kept for `TEXT_PATH` (the console shows who applied what and when)


class Signal:
    """Wakes every waiter once per `fire` (asyncio, one loop)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), timeout)


@dataclass(frozen=True)
class ApplyResult:
    status: int  # 200 applied everywhere, 400 invalid (nothing changed), 422 refused, 504 not confirmed
    body: dict[str, Any]


@dataclass
class Counts:
    applies: dict[str, int] = field(default_factory=dict)  # result -> count
    nacks: int = 0

    def count(self, result: str) -> None:
        self.applies[result] = self.applies.get(result, 0) + 1


class LiveConfig:
    def __init__(self, env: EnvironmentConfig, initial: Candidate, *, timeout_s: float = 30.0,
                 subscribers: Subscribers | None = None) -> None:
        self.env = env
        self.timeout_s = timeout_s
        self.ledger = Ledger()
        self.subscribers = subscribers or Subscribers()
        self.changed = Signal()  # an Envoy or a worker acked, or a worker polled
        self.published = Signal()  # `running` moved: open long polls answer
        self.ads = AdsService(self.ledger, self._on_envoy)
        self.running = initial  # what the extprocs are offered
        self.applied_at = time.time()
        self.applied_by = "start"  # who applied the running version (`start`: the file the control plane began with)
        self.counts = Counts()
        self.previous: Candidate | None = None  # what ran before the last apply that moved `running`
        self.history: list[dict[str, Any]] = []  # the recent applies, oldest first (the console's Config page)
        self._lock = asyncio.Lock()
        self.ledger.publish(initial.snapshot)

    def _on_envoy(self) -> None:
        self.changed.fire()

    async def apply(self, text: bytes, source: str = "<apply>", applied_by: str = "unknown") -> ApplyResult:
        result = await self._apply(text, source, applied_by)
        self.history = [*self.history[-(HISTORY - 1):], {
            "at": time.time(), "applied_by": applied_by, "status": result.status,
            "version": result.body.get("version", config_version(text)), "error": result.body.get("error")}]
        self.counts.count({200: "ok", 400: "invalid", 422: "refused", 504: "timeout"}.get(result.status, "error"))
        level = logging.INFO if result.status == 200 else logging.WARNING
        log.log(level, "apply by %s (%s): %d %s", applied_by, source, result.status, result.body)
        return result

    async def _apply(self, text: bytes, source: str, applied_by: str) -> ApplyResult:
        try:
            cand = await asyncio.to_thread(candidate, text, self.env, self.running.cfg, source)
        except ConfigError as e:
            return ApplyResult(400, {"error": str(e)})
        async with self._lock:
            # Another apply may have finished while this one waited for the lock.
            if fixed := restart_only(self.running.cfg, cand.cfg):
                return ApplyResult(400, {"error": f"{source}: {', '.join(fixed)} cannot change on a running gateway"})
            if self._everywhere(cand.version):
                return ApplyResult(200, {"version": cand.version, "unchanged": True})
            deadline = time.monotonic() + self.timeout_s
            assert self.ledger.current is not None
            step = bridge(cand.snapshot, self.ledger.current.snapshot)
            if (failed := await self._to_envoy(step, deadline)) is not None:
                return failed
            self.previous = self.running
            self.running, self.applied_at, self.applied_by = cand, time.time(), applied_by
            self.published.fire()
            if (failed := await self._to_workers(cand.version, deadline)) is not None:
                return failed  # Envoy stays on the bridge: it serves both the old and the new config
            if step is not cand.snapshot and (failed := await self._to_envoy(cand.snapshot, deadline)) is not None:
                return failed
            return ApplyResult(200, {"version": cand.version})

    def _everywhere(self, version: str) -> bool:
        cur = self.ledger.current
        return (self.running.version == version and cur is not None and cur.snapshot.final
                and cur.snapshot.version == version and self.ledger.settled(cur.serial)
                and self.subscribers.progress(version).done)

    async def _to_envoy(self, snap: Snapshot, deadline: float) -> ApplyResult | None:
        pub = self.ledger.publish(snap)
        self.ads.push()
        done = await self._until(lambda: self.ledger.settled(pub.serial) or self.ledger.refused(pub.serial) is not None,
                                 deadline)
        if (nack := self.ledger.refused(pub.serial)) is not None:
            self.counts.nacks += 1
            good = self.ledger.good.snapshot.version if self.ledger.good else "none"
            return ApplyResult(422, {"error": f"Envoy ({nack.node}) refused version {snap.version}: {nack.message}; "
                                              f"it keeps serving version {good}", "version": snap.version})
        if not done:
            return ApplyResult(504, {"error": f"Envoy did not confirm version {snap.version} within "
                                              f"{self.timeout_s:g}s", "version": snap.version})
        self.ledger.clear_nack()
        return None

    async def _to_workers(self, version: str, deadline: float) -> ApplyResult | None:
        done = await self._until(lambda: bool(self.subscribers.progress(version).refused)
                                 or self.subscribers.progress(version).done, deadline)
        p = self.subscribers.progress(version)
        if p.refused:
            why = "; ".join(f"{w}: {e}" for w, e in sorted(p.refused.items()))
            return ApplyResult(422, {"error": f"extproc workers refused version {version}: {why}", "version": version})
        if not done:
            return ApplyResult(504, {"error": f"extproc workers {', '.join(p.missing)} did not confirm version "
                                              f"{version} within {self.timeout_s:g}s", "version": version})
        return None

    async def _until(self, ready: Callable[[], bool], deadline: float) -> bool:
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Re-check at least every second: a worker going stale leaves the set without an event.
            await self.changed.wait(min(left, 1.0))
        return True

    def text(self) -> dict[str, Any]:
        """The running text, the one before it and the recent applies (`TEXT_PATH`)."""
        prev = self.previous
        return {"version": self.running.version, "yaml": self.running.text.decode("utf-8", "replace"),
                "applied_by": self.applied_by, "applied_at": self.applied_at, "history": self.history,
                "previous": None if prev is None else {"version": prev.version,
                                                       "yaml": prev.text.decode("utf-8", "replace")}}

    def status(self) -> dict[str, Any]:
        ledger = self.ledger
        envoys = [{"stream": s.id, "node": s.node, "peer": s.peer, "version": ledger.stream_version(s)}
                  for s in ledger.streams.values()]
        nack = ledger.last_nack
        now = time.monotonic()
        return {
            "version": self.running.version,
            "applied_at": self.applied_at,
            "applied_by": self.applied_by,
            "envoy": {
                "serving": ledger.current.snapshot.version if ledger.current else None,
                "last_good": ledger.good.snapshot.version if ledger.good else None,
                "streams": envoys,
                "nack": None if nack is None else {"version": nack.version, "type": nack.type_url.rsplit(".", 1)[-1],
                                                   "node": nack.node, "error": nack.message, "at": nack.at},
            },
            "workers": [{"worker": w.id, "version": w.version, "seen_s_ago": round(now - w.last_seen, 1),
                         "error": w.error or None} for w in self.subscribers.live()],
        }
