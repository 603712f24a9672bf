"""Concentration breakers over groups of models (`routing.share_breakers`).

A strategy that scores one model best (the cheapest, say) sends it every call of a group such as
`auto` until it buckles. A share breaker counts the group's routed calls (those asking for the group by
name; for a listed set of models, those where routing chose among two or more of them) per member
over a sliding window; when one member took more than `max_share` of them (with at least `min_calls`), that member
trips: the scheduler skips it while another member can take the call, for `open_s` and until its
share is back at `max_share` or under (the others' calls bring it down). With no other member left
the tripped one still serves: the breaker moves load, it never refuses a call.

Pure: times are passed in (monotonic seconds).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from contracts.config.routing import ShareBreakerSettings


@dataclass(frozen=True, slots=True)
class ShareTrip:
    """One member tripped: its breaker's label and the share that tripped it."""

    label: str
    member: str
    share: float
    calls: int
    settings: ShareBreakerSettings


@dataclass(slots=True, eq=False)
class ShareBreaker:
    settings: ShareBreakerSettings
    members: frozenset[str]
    window: deque[tuple[float, str]] = field(default_factory=deque)
    counts: Counter[str] = field(default_factory=Counter)
    # tripped member -> the earliest time it may heal
    tripped: dict[str, float] = field(default_factory=dict)
    trips: int = 0

    def label(self, member: str) -> str:
        return f"share:{self.settings.name}:{member}"

    def _prune(self, now: float) -> None:
        horizon = now - self.settings.window_s
        w = self.window
        while w and w[0][0] < horizon:
            _, m = w.popleft()
            self.counts[m] -= 1

    def share(self, member: str, now: float) -> float:
        self._prune(now)
        n = len(self.window)
        return self.counts[member] / n if n else 0.0

    def _over(self, member: str) -> bool:
        n = len(self.window)
        return n >= self.settings.min_calls and self.counts[member] > self.settings.max_share * n

    def skips(self, member: str, now: float) -> bool:
        """Whether `member` is tripped now; past `open_s` with its share fallen back, it heals."""
        until = self.tripped.get(member)
        if until is None:
            return False
        if now < until:
            return True
        self._prune(now)
        if self._over(member):
            return True
        del self.tripped[member]
        return False

    def counts_call(self, asked: str, choice: Iterable[str]) -> bool:
        """A call for `asked` that routing chose among `choice` (the models that name resolved to) is the
        group's: asked by the group's name, or (a listed set) with two or more members to choose from."""
        if self.settings.group is not None:
            return asked == self.settings.group
        return len(self.members.intersection(choice)) >= 2

    def routed(self, member: str, now: float, asked: str = "", choice: Iterable[str] = ()) -> ShareTrip | None:
        """A call for `asked` went to `member` among `choice`; the trip it caused, if any."""
        if member not in self.members or not self.counts_call(asked, choice):
            return None
        self.window.append((now, member))
        self.counts[member] += 1
        self._prune(now)
        if member in self.tripped or not self._over(member):
            return None
        self.tripped[member] = now + self.settings.open_s
        self.trips += 1
        n = len(self.window)
        return ShareTrip(self.label(member), member, self.counts[member] / n, n, self.settings)

    def reason(self, member: str, now: float) -> str:
        left = max(self.tripped.get(member, now) - now, 0.0)
        if math.isinf(left):
            return f"share breaker {self.settings.name}: {member} tripped (as the running extproc reports)"
        return (f"share breaker {self.settings.name}: {member} took {self.share(member, now):.0%} of "
                f"{len(self.window)} calls in {self.settings.window_s:g}s (max {self.settings.max_share:.0%}; "
                + (f"{left:.1f}s left)" if left > 0 else "until its share falls)"))


class ShareBreakers:
    """Every configured share breaker, each over its group's member models."""

    def __init__(self, settings: Iterable[ShareBreakerSettings], groups: Mapping[str, tuple[str, ...]]):
        self.all = [ShareBreaker(s, frozenset(s.models if s.models is not None else groups.get(s.group or "", ())))
                    for s in settings]
        self.reindex()

    def reindex(self) -> None:
        self.by_member: dict[str, list[ShareBreaker]] = {}
        for b in self.all:
            for m in b.members:
                self.by_member.setdefault(m, []).append(b)

    def __bool__(self) -> bool:
        return bool(self.all)

    def skipping(self, member: str, now: float) -> ShareBreaker | None:
        """The first breaker that has `member` tripped now, or None."""
        for b in self.by_member.get(member, ()):
            if b.skips(member, now):
                return b
        return None

    def routed(self, member: str, asked: str, choice: tuple[str, ...], now: float) -> list[ShareTrip]:
        """Count one call for `asked` routed to `member` among `choice` in every group it is the
        group's call of; returns the trips."""
        return [t for b in self.by_member.get(member, ()) if (t := b.routed(member, now, asked, choice)) is not None]

    def hold(self, label: str) -> None:
        """Trip the member a running extproc reports tripped (`route explain --live`): its counts are not
        known here, so it stays tripped for this scheduler's life."""
        for b in self.all:
            for m in b.members:
                if b.label(m) == label:
                    b.tripped[m] = math.inf

    def states(self, now: float) -> dict[str, int]:
        """Each (breaker, member): 1 tripped, 0 not (modelyard_breaker_state)."""
        return {b.label(m): int(b.skips(m, now)) for b in self.all for m in sorted(b.members)}
