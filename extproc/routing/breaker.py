"""Total breakers over groups (`routing.breakers`): a model's or a channel's deployments together.

A cluster's cooldown judges one deployment; when every deployment of a model fails together (the
provider is down, a bad release everywhere), routing would keep spreading calls over them while
each cools down in turn. A group breaker counts the group's outcomes over a sliding window and,
past `error_rate` (with at least `min_calls`), opens: the scheduler routes around the group (a
spill to what else the caller's model or group allows) or, with nothing left, refuses at once with
503 and a retry-after. After `open_s` it is half-open: `probes` calls go through; all of them
answering closes it, one failing opens it again. A probe that never reports (its client left) is
replaced after `open_s`, so the breaker cannot stay half-open for good.

Pure: times are passed in (monotonic seconds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from contracts.config.routing import GroupBreakerSettings

State = Literal["closed", "open", "half_open"]
STATE_VALUE: dict[State, int] = {"closed": 0, "open": 1, "half_open": 2}


@dataclass(slots=True, eq=False)
class GroupBreaker:
    settings: GroupBreakerSettings
    state: State = "closed"
    window: deque[tuple[float, bool]] = field(default_factory=deque)
    failures: int = 0
    open_until: float = 0.0
    probes_sent: int = 0
    probes_ok: int = 0
    probe_at: float = 0.0
    trips: int = 0

    @property
    def group(self) -> str:
        return self.settings.group

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.window_s
        w = self.window
        while w and w[0][0] < horizon:
            _, ok = w.popleft()
            if not ok:
                self.failures -= 1

    def _trip(self, now: float) -> None:
        self.state = "open"
        self.open_until = now + self.settings.open_s
        self.window.clear()
        self.failures = 0
        self.trips += 1

    def current(self, now: float) -> State:
        """The state now: an open breaker past `open_until` is half-open."""
        if self.state == "open" and now >= self.open_until:
            self.state, self.probes_sent, self.probes_ok, self.probe_at = "half_open", 0, 0, now
        if self.state == "half_open" and self.probes_sent >= self.settings.probes \
                and now - self.probe_at >= self.settings.open_s:
            self.probes_sent = self.probes_ok  # probes that never reported: send new ones
        return self.state

    def admits(self, now: float) -> bool:
        st = self.current(now)
        return st == "closed" or (st == "half_open" and self.probes_sent < self.settings.probes)

    def routed(self, now: float) -> None:
        """A call was sent into the group: in half-open, one probe spent."""
        if self.current(now) == "half_open":
            self.probes_sent += 1
            self.probe_at = now

    def record(self, ok: bool, now: float) -> bool:
        """One upstream outcome in the group; True when it tripped the breaker."""
        st = self.current(now)
        if st == "open":
            return False  # late answers of calls sent before it opened
        if st == "half_open":
            if not ok:
                self._trip(now)
                return True
            self.probes_ok += 1
            if self.probes_ok >= self.settings.probes:
                self.state = "closed"
            return False
        self.window.append((now, ok))
        if not ok:
            self.failures += 1
        self._prune(now)
        n = len(self.window)
        if n >= self.settings.min_calls and self.failures >= self.settings.error_rate * n:
            self._trip(now)
            return True
        return False

    def retry_after(self, now: float) -> float:
        return max(self.open_until - now, 0.0) if self.state == "open" else 0.0


class Breakers:
    """Every configured group breaker, and which of them a deployment (model, cluster, channel) is in."""

    def __init__(self, settings: Iterable[GroupBreakerSettings], deployments: Iterable[tuple[str, str, str]]):
        self.all = [GroupBreaker(s) for s in settings]
        self._deployments = tuple(deployments)
        self.reindex()

    def reindex(self) -> None:
        """Map every deployment to its breakers (again, after a reload swapped some in)."""
        # cluster -> the breakers whose group holds it (outcomes are recorded per cluster)
        self.by_cluster: dict[str, list[GroupBreaker]] = {}
        self.by_entry: dict[tuple[str, str], list[GroupBreaker]] = {}
        for model, cluster, channel in self._deployments:
            for b in self.all:
                s = b.settings
                if s.model == model or s.channel == channel:
                    self.by_entry.setdefault((model, cluster), []).append(b)
                    if all(x is not b for x in self.by_cluster.setdefault(cluster, [])):
                        self.by_cluster[cluster].append(b)

    def __bool__(self) -> bool:
        return bool(self.all)

    def blocking(self, model: str, cluster: str, now: float) -> GroupBreaker | None:
        """The first breaker that keeps this deployment out now, or None."""
        for b in self.by_entry.get((model, cluster), ()):
            if not b.admits(now):
                return b
        return None

    def routed(self, model: str, cluster: str, now: float) -> None:
        for b in self.by_entry.get((model, cluster), ()):
            b.routed(now)

    def record(self, cluster: str, ok: bool, now: float) -> list[GroupBreaker]:
        """Feed one outcome; returns the breakers it tripped."""
        return [b for b in self.by_cluster.get(cluster, ()) if b.record(ok, now)]

    def states(self, now: float) -> Mapping[str, State]:
        return {b.group: b.current(now) for b in self.all}
