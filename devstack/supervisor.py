"""Keeps a running stack serving: a dead child is logged and restarted with exponential backoff;
a replica (extproc) from its warm standby when one waits, so Envoy is back to serving within a
second while it answers the gap itself (503 + retry-after, controlplane.local_replies).

The stack must stop when an essential child (Envoy) dies, or when a replica cannot start at all
(it exits before it is ready `Backoff.failed_starts` times in a row); `Supervisor.tick` then
returns why, with the end of that child's log, and `Supervisor.run` returns it to the caller.
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
    child has stayed up for `stable_s` (a crash loop slows down, a rare crash restarts fast).
    A replica that exits before it is ready `failed_starts` times in a row cannot start at all."""

    initial: float = 0.2
    cap: float = 30.0
    stable_s: float = 60.0
    failed_starts: int = 3


@dataclass
class _Watch:
    next_delay: float
    restart_at: float | None = None  # set while the child is dead and waiting for its restart
    starting: bool = False  # respawned, not yet ready
    failed_starts: int = 0  # exits before ready, in a row
    up_since: float = 0.0  # the supervisor's clock at the last spawn (or when first watched)


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
        w = self._watch.get(child.name)
        if w is None:  # started before the supervisor: up since it first looked
            w = self._watch[child.name] = _Watch(self.backoff.initial, up_since=self._clock())
        return w

    def tick(self) -> str | None:
        """Handle deaths, due restarts and restarted children becoming ready; why the stack must stop, or None."""
        now = self._clock()
        for child in self.children:
            w = self._w(child)
            if w.restart_at is not None:
                if now >= w.restart_at:
                    w.restart_at = None
                    w.starting = True
                    w.up_since = now
                    warm = child.standby is not None and child.standby.poll() is None
                    child.spawn(self.log_dir)
                    if warm and child.proc is not None:
                        self._log(f"modelyard: {child.name}'s standby took over (pid {child.proc.pid})")
                continue
            code = child.exit_code()
            if code is None:
                if w.starting and child.proc is not None and child.is_ready():
                    w.starting = False
                    w.failed_starts = 0
                    self._log(f"modelyard: {child.name} restarted (pid {child.proc.pid}) and ready")
                if not w.starting:
                    # A spare for the next death, only once this one serves: it would slow the start.
                    child.spawn_standby(self.log_dir)
                continue
            where = f"{child.name} exited with code {code} (log {child.log_path(self.log_dir)})"
            if child.role == "essential":
                return self._stop(f"{where}; the stack cannot serve without it")
            if w.starting:
                w.failed_starts += 1
                if child.role == "replica" and w.failed_starts >= self.backoff.failed_starts:
                    return self._stop(f"{where}; it cannot start: {w.failed_starts} starts in a row exited "
                                      "before it was ready", child.log_tail(self.log_dir))
            # The supervisor's own clock: a child's spawn time is another clock's (tests drive this one).
            if now - w.up_since >= self.backoff.stable_s:
                w.next_delay = self.backoff.initial  # it had been fine for a while: not a crash loop
            delay = w.next_delay
            w.next_delay = min(self.backoff.cap, delay * 2)
            w.restart_at = now + delay
            w.starting = False
            self._log(f"modelyard: {where}; restarting in {delay:g}s")
        return None

    def _stop(self, why: str, log_tail: str = "") -> str:
        said = f"{why}; its log ends:\n" + "\n".join(f"    {ln}" for ln in log_tail.splitlines()) if log_tail else why
        self._log(f"modelyard: {said}" + ("\nmodelyard: stopping" if log_tail else "; stopping"))
        return said

    def run(self, should_stop: Callable[[], bool], interval: float = 0.1) -> str | None:
        """Supervise until the stack must stop (returns why) or `should_stop()` (returns None)."""
        while not should_stop():
            why = self.tick()
            if why:
                return why
            time.sleep(interval)
        return None
