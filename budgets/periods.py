"""A budget's period as a window of UTC days: the day, the ISO week (from Monday) or the calendar
month that holds a moment, and when it resets. Spend is kept per UTC day (`day_of`), so every
window is a run of whole days."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from contracts.config.keys import Period

DAY_S = 86_400
PERIODS: tuple[Period, ...] = ("day", "week", "month")
_EPOCH = date(1970, 1, 1)


def day_of(ts: float) -> int:
    """The UTC day of a unix time, as days since 1970-01-01."""
    return math.floor(ts / DAY_S)


def _day_number(d: date) -> int:
    return (d - _EPOCH).days


@dataclass(frozen=True, slots=True)
class Window:
    """Days `first` .. `last` inclusive; it starts at `start` and resets at `end` (unix seconds)."""

    period: Period
    first: int
    last: int

    @property
    def start(self) -> float:
        return float(self.first * DAY_S)

    @property
    def end(self) -> float:
        return float((self.last + 1) * DAY_S)

    def holds(self, day: int) -> bool:
        return self.first <= day <= self.last

    def seconds_left(self, now: float) -> float:
        return max(0.0, self.end - now)

    def iso_start(self) -> str:
        return _iso(self.start)

    def iso_end(self) -> str:
        return _iso(self.end)


def window(period: Period, now: float) -> Window:
    """The window of `period` that holds `now`."""
    return _window_of_day(period, day_of(now))


@lru_cache(maxsize=64)  # the request path asks per call; the answer changes once a day
def _window_of_day(period: Period, day: int) -> Window:
    if period == "day":
        return Window("day", day, day)
    if period == "week":
        d = _EPOCH + timedelta(days=day)
        first = day - d.weekday()  # ISO weeks start on Monday (weekday 0)
        return Window("week", first, first + 6)
    if period == "month":
        month = (_EPOCH + timedelta(days=day)).replace(day=1)
        nxt = date(month.year + month.month // 12, month.month % 12 + 1, 1)
        return Window("month", _day_number(month), _day_number(nxt) - 1)
    raise ValueError(f"unknown budget period {period!r}")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
