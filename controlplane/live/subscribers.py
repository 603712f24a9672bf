"""The extproc workers and replicas that long-poll the control plane (contracts/live_config.py):
what each one runs and when it was last heard from. A worker polling now, or heard from within
`stale_after_s`, is live; an apply waits for the live ones only, so a replica that went away does
not hold every later apply up to its timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from contracts.live_config import WAIT_S


@dataclass
class Worker:
    id: str
    version: str = ""
    last_seen: float = 0.0
    polling: int = 0  # long polls open now
    error: str = ""  # its last refusal of a version
    refused: str = ""  # the version it refused


@dataclass(frozen=True)
class Progress:
    """Where the live workers stand on one version."""

    missing: tuple[str, ...]  # live workers without it yet
    refused: dict[str, str]  # worker -> why it refused it

    @property
    def done(self) -> bool:
        return not self.missing and not self.refused


class Subscribers:
    def __init__(self, clock: Callable[[], float] = time.monotonic, stale_after_s: float = 2 * WAIT_S) -> None:
        self._clock = clock
        self.stale_after_s = stale_after_s
        self.workers: dict[str, Worker] = {}

    def _get(self, worker: str) -> Worker:
        w = self.workers.setdefault(worker, Worker(worker))
        w.last_seen = self._clock()
        return w

    def polled(self, worker: str, have: str) -> None:
        """A long poll arrived: `have` is the version the worker runs, or the one it last refused
        (an extproc asks with the last version it was offered, so a refused one is not sent again)."""
        w = self._get(worker)
        if have != w.refused:
            w.version = have
        w.polling += 1

    def poll_ended(self, worker: str) -> None:
        w = self._get(worker)
        w.polling = max(0, w.polling - 1)

    def acked(self, worker: str, version: str, ok: bool, error: str = "") -> None:
        w = self._get(worker)
        if ok:
            w.version, w.error, w.refused = version, "", ""
        else:
            w.error, w.refused = error or "refused", version

    def live(self) -> list[Worker]:
        now = self._clock()
        self._forget(now)
        return [w for w in self.workers.values() if w.polling or now - w.last_seen <= self.stale_after_s]

    def _forget(self, now: float) -> None:
        # Long gone workers leave the status too (a replica scaled down, a restarted worker's old id).
        for wid in [w.id for w in self.workers.values() if not w.polling and now - w.last_seen > 10 * self.stale_after_s]:
            del self.workers[wid]

    def progress(self, version: str) -> Progress:
        live = self.live()
        refused = {w.id: w.error for w in live if w.refused == version}
        missing = tuple(sorted(w.id for w in live if w.version != version and w.id not in refused))
        return Progress(missing, refused)
