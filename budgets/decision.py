"""Where a budget stands and what that means for the next call: pure functions over numbers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from budgets.periods import Window
from contracts.config.keys import Budget

Scope = Literal["key", "tenant"]
Verdict = Literal["allow", "soft", "refuse"]


def verdict(spent: float, budget: Budget) -> Verdict:
    """`refuse` once the period's spend reached the cap (a 0 budget refuses everything); `soft`
    past `soft_share` of it; else `allow`."""
    if spent >= budget.usd:
        return "refuse"
    if spent >= budget.usd * budget.soft_share:
        return "soft"
    return "allow"


def crossed_soft(before: float, after: float, budget: Budget) -> bool:
    """Whether spend going from `before` to `after` passed the soft threshold just now."""
    mark = budget.usd * budget.soft_share
    return before < mark <= after


@dataclass(frozen=True, slots=True)
class Standing:
    """One budget's state in its current window."""

    scope: Scope
    id: str  # the key id or the tenant name
    tenant: str
    budget: Budget
    spent: float
    window: Window

    @property
    def verdict(self) -> Verdict:
        return verdict(self.spent, self.budget)

    @property
    def used_ratio(self) -> float:
        """Spend over the cap; a 0 cap counts as used up."""
        return self.spent / self.budget.usd if self.budget.usd > 0 else 1.0

    def retry_after_s(self, now: float) -> int:
        """Whole seconds until the window resets (at least 1)."""
        return max(1, math.ceil(self.window.seconds_left(now)))

    def describe(self) -> str:
        return (f"{self.scope} {self.id!r} spent ${self.spent:.6g} of its ${self.budget.usd:g} budget per "
                f"{self.budget.period}, which resets at {self.window.iso_end()}")


def refusal(standings: Iterable[Standing]) -> Standing | None:
    """The exhausted budget that resets last (the call may go only once every cap has reset), or
    None when no budget refuses."""
    spent = [s for s in standings if s.verdict == "refuse"]
    return max(spent, key=lambda s: s.window.end) if spent else None


class SoftAlerts:
    """Which budgets are past their soft share and not yet announced for their window: each
    (scope, id, period, window) is due once."""

    def __init__(self) -> None:
        self._done: set[tuple[str, str, str, int]] = set()

    def due(self, standings: Iterable[Standing]) -> list[Standing]:
        out = []
        for s in standings:
            if s.verdict == "allow":
                continue
            mark = (s.scope, s.id, s.budget.period, s.window.first)
            if mark not in self._done:
                self._done.add(mark)
                out.append(s)
        return out

    def retry(self, s: Standing) -> None:
        """Announcing `s` failed: due again next time."""
        self._done.discard((s.scope, s.id, s.budget.period, s.window.first))

    def forget_before(self, day: int) -> None:
        """Drop marks of windows that began before `day` (a caller passes a day past every live window)."""
        self._done = {m for m in self._done if m[3] >= day}
