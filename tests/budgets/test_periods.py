"""Budget periods as UTC windows: the day, the ISO week from Monday, the calendar month, and when
each resets."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from budgets.periods import DAY_S, PERIODS, day_of, window


def _ts(*args: int) -> float:
    return datetime(*args, tzinfo=UTC).timestamp()


def _day(*args: int) -> int:
    return day_of(_ts(*args))


@pytest.mark.parametrize(("now", "period", "first", "reset"), [
    pytest.param(_ts(2026, 12, 3, 18, 47), "day", (2026, 12, 3), (2026, 12, 4), id="day"),
    pytest.param(_ts(2026, 12, 3, 0, 0), "day", (2026, 12, 3), (2026, 12, 4), id="day-at-midnight"),
    pytest.param(_ts(2026, 12, 3, 23, 59, 59), "day", (2026, 12, 3), (2026, 12, 4), id="day-last-second"),
    # 2026-12-03 is a Thursday: its ISO week began Monday 2026-11-30, across the month boundary
    pytest.param(_ts(2026, 12, 3, 12), "week", (2026, 11, 30), (2026, 12, 7), id="week-across-months"),
    pytest.param(_ts(2026, 11, 30, 0, 0), "week", (2026, 11, 30), (2026, 12, 7), id="week-on-monday"),
    pytest.param(_ts(2026, 12, 6, 23, 59), "week", (2026, 11, 30), (2026, 12, 7), id="week-on-sunday-night"),
    # ISO week 1 of 2027 starts Monday 2027-01-04; 2026-12-28 .. 2027-01-03 is one week across the year
    pytest.param(_ts(2027, 1, 2), "week", (2026, 12, 28), (2027, 1, 4), id="week-across-years"),
    pytest.param(_ts(2026, 12, 31, 23, 59), "month", (2026, 12, 1), (2027, 1, 1), id="month-december"),
    pytest.param(_ts(2028, 2, 29, 12), "month", (2028, 2, 1), (2028, 3, 1), id="month-leap-february"),
    pytest.param(_ts(2027, 2, 28, 23, 59, 59), "month", (2027, 2, 1), (2027, 3, 1), id="month-february-end"),
    pytest.param(_ts(2026, 4, 30, 23), "month", (2026, 4, 1), (2026, 5, 1), id="month-30-days"),
])
def test_windows_and_resets(now: float, period: str, first: tuple[int, int, int], reset: tuple[int, int, int]) -> None:
    w = window(period, now)  # type: ignore[arg-type]
    assert w.start == _ts(*first)
    assert w.end == _ts(*reset)
    assert w.first == _day(*first) and w.last == _day(*reset) - 1
    assert w.holds(day_of(now)) and not w.holds(w.last + 1) and not w.holds(w.first - 1)
    assert w.seconds_left(now) == _ts(*reset) - now
    assert w.iso_end() == datetime(*reset, tzinfo=UTC).isoformat().replace("+00:00", "Z")


def test_days_are_utc_and_a_window_is_whole_days() -> None:
    assert day_of(0) == 0 and day_of(DAY_S - 0.001) == 0 and day_of(DAY_S) == 1 and day_of(-1) == -1
    w = window("month", _ts(2026, 12, 15))
    assert w.last - w.first + 1 == 31 and (w.end - w.start) == 31 * DAY_S


def test_every_period_window_holds_its_moment() -> None:
    for now in (_ts(2026, 12, 3), _ts(2027, 1, 1), _ts(2028, 2, 29, 23, 59, 59)):
        assert all(window(p, now).holds(day_of(now)) for p in PERIODS)


def test_an_unknown_period_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown budget period"):
        window("year", 0.0)  # type: ignore[arg-type]
