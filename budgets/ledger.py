"""Spend per (scope, id) in a window, as one process sees it: the shared store's last totals per
window, plus what this process spent since (per UTC day) and has not yet seen come back.

The request path calls `add` and `spent` (dict work under a short lock, no I/O); the sync thread
calls `take` (the unflushed spend, to write), `restore` (a write failed) and `install` (fresh
totals for the current windows, read after the write). Spend taken for a write stays counted until
the totals that hold it are installed, so nothing is counted twice or missed in between. A window
the installed totals do not cover (the day just turned) counts the local spend alone until the
next round.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence

from budgets.decision import Scope
from budgets.periods import Window, day_of

# (scope, id) -> day -> usd
Days = dict[int, float]
Key = tuple[str, str]
# (period, first day) of a window -> usd
Windows = dict[tuple[str, int], float]
# What a write carries: (scope, id, day) -> usd
Batch = dict[tuple[str, str, int], float]


class Ledger:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stored: dict[Key, Windows] = {}
        self._unsent: dict[Key, Days] = defaultdict(dict)  # not yet written
        self._written: dict[Key, Days] = defaultdict(dict)  # written, not yet in `_stored`

    def add(self, tenant: str, key_id: str | None, usd: float, now: float) -> None:
        """A call's metered cost: the tenant's and (a stored key's) the key's."""
        if usd <= 0:
            return
        day = day_of(now)
        with self._lock:
            _bump(self._unsent, ("tenant", tenant), day, usd)
            if key_id is not None:
                _bump(self._unsent, ("key", key_id), day, usd)

    def spent(self, scope: Scope, id: str, window: Window) -> float:
        key = (scope, id)
        first, last = window.first, window.last
        with self._lock:
            stored = self._stored.get(key)
            total = stored.get((window.period, first), 0.0) if stored else 0.0
            for table in (self._unsent, self._written):
                days = table.get(key)
                if days:
                    for day, usd in days.items():
                        if first <= day <= last:
                            total += usd
        return total

    def take(self) -> Batch:
        """The unflushed spend, moved to `written` (still counted) for the caller to store."""
        with self._lock:
            batch = {(s, i, d): usd for (s, i), days in self._unsent.items() for d, usd in days.items()}
            for key, days in self._unsent.items():
                for day, usd in days.items():
                    _bump(self._written, key, day, usd)
            self._unsent = defaultdict(dict)
        return batch

    def restore(self, batch: Batch) -> None:
        """The write of `batch` failed: it goes back to the unflushed spend for the next try."""
        with self._lock:
            for (scope, id, day), usd in batch.items():
                days = self._written.get((scope, id))
                if days is not None and day in days:
                    left = days[day] - usd
                    if abs(left) < 1e-15:
                        del days[day]
                    else:
                        days[day] = left
                _bump(self._unsent, (scope, id), day, usd)

    def install(self, windows: Sequence[Window], rows: Iterable[tuple[str, str, Sequence[float]]]) -> None:
        """Totals per (scope, id) in each of `windows` (in order), read from the store after every
        write taken so far: they hold all of `written`."""
        marks = [(w.period, w.first) for w in windows]
        stored: dict[Key, Windows] = {(scope, id): dict(zip(marks, usd)) for scope, id, usd in rows}
        with self._lock:
            self._stored = stored
            self._written = defaultdict(dict)

    def ids(self, scope: Scope) -> set[str]:
        """Every id of `scope` with spend on record (stored or not)."""
        with self._lock:
            return {i for src in (self._stored, self._unsent, self._written) for s, i in src if s == scope}


def _bump(table: dict[Key, Days], key: Key, day: int, usd: float) -> None:
    days = table.get(key)
    if days is None:
        days = table[key] = {}
    days[day] = days.get(day, 0.0) + usd
