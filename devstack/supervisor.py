"""Keeps a running stack serving: a dead child is logged and, unless its role says the stack cannot
serve without it, restarted with exponential backoff.

The stack must stop when an essential child (Envoy) dies or every replica (extproc) is dead;
`Supervisor.tick` then returns why, and `Supervisor.run` returns it to the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from devstack.child import Child


@dataclass(frozen=True)
class Backoff:
    """Restart delays: `initial` doubling per quick death up to `cap`, back to `initial` once a
    child has stayed up for `stable_s` (a crash loop slows down, a rare crash restarts fast)."""

    initial: float = 0.5
    cap: float = 30.0
    stable_s: float = 60.0


@dataclass
class _Watch:
    next_delay: float
    restart_at: float | None = None  # set while the child is dead and waiting for its restart
    starting: bool = False  # respawned, not yet ready


class Supervisor:
    """Watches `children` (already started); call `tick` periodically or `run` to loop."""

    def __init__(self, children: Sequence[Child], log_dir: Path, *, backoff: Backoff = Backoff(),
                 log: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.children = children
        self.log_dir = log_dir
        self.backoff = backoff
        self._log = log or (lambda line: print(line, flush=True))
        self._clock = clock
        self._watch: dict[str, _Watch] = {}

    def _w(self, child: Child) -> _Watch:
        return self._watch.setdefault(child.name, _Watch(self.backoff.initial))

    def _dead(self, child: Child) -> bool:
        return self._w(child).restart_at is not None or child.exit_code() is not None

    def tick(self) -> str | None:
        """Handle deaths, due restarts and restarted children becoming ready; why the stack must stop, or None."""
        now = self._clock()
        for child in self.children:
            w = self._w(child)
            if w.restart_at is not None:
                if now >= w.restart_at:
                    w.restart_at = None
                    w.starting = True
                    child.spawn(self.log_dir)
                continue
            code = child.exit_code()
            if code is None:
                if w.starting and child.proc is not None and child.is_ready():
                    w.starting = False
                    self._log(f"modelyard: {child.name} restarted (pid {child.proc.pid}) and ready")
                continue
            where = f"{child.name} exited with code {code} (log {child.log_path(self.log_dir)})"
            if child.role == "essential":
                return self._stop(f"{where}; the stack cannot serve without it")
            if child.role == "replica" and all(self._dead(c) for c in self.children if c.role == "replica"):
                return self._stop(f"{where}; no other replica is alive")
            if now - child.started_at >= self.backoff.stable_s:
                w.next_delay = self.backoff.initial  # it had been fine for a while: not a crash loop
            delay = w.next_delay
            w.next_delay = min(self.backoff.cap, delay * 2)
            w.restart_at = now + delay
            w.starting = False
            self._log(f"modelyard: {where}; restarting in {delay:g}s")
        return None

    def _stop(self, why: str) -> str:
        self._log(f"modelyard: {why}; stopping")
        return why

    def run(self, should_stop: Callable[[], bool], interval: float = 0.2) -> str | None:
        """Supervise until the stack must stop (returns why) or `should_stop()` (returns None)."""
        while not should_stop():
            why = self.tick()
            if why:
                return why
            time.sleep(interval)
        return None
