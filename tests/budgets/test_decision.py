"""Refuse, soft warning or allow, from the numbers alone; the soft share is announced once per
budget and window; key budgets (a Caller's) and tenant budgets refuse alike."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from budgets.decision import SoftAlerts, Standing, crossed_soft, refusal, verdict
from budgets.periods import window
from contracts.config.keys import Budget

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(("spent", "expected"), [
    pytest.param(0.0, "allow", id="nothing-spent"),
    pytest.param(7.99, "allow", id="under-soft"),
    pytest.param(8.0, "soft", id="at-soft-share"),
    pytest.param(9.99, "soft", id="past-soft"),
    pytest.param(10.0, "refuse", id="exactly-spent"),
    pytest.param(12.5, "refuse", id="overshot-by-a-stream"),
])
def test_verdicts(spent: float, expected: str) -> None:
    assert verdict(spent, Budget(usd=10, period="day", soft_share=0.8)) == expected


def test_a_zero_budget_refuses_everything_and_reads_as_used_up() -> None:
    b = Budget(usd=0, period="month")
    assert verdict(0.0, b) == "refuse"
    assert Standing("key", "k1", "t", b, 0.0, window("month", NOW)).used_ratio == 1.0


def test_soft_crossing_is_the_step_that_passes_the_mark() -> None:
    b = Budget(usd=10, soft_share=0.5)
    assert crossed_soft(4.9, 5.0, b) and crossed_soft(0, 100, b)
    assert not crossed_soft(5.0, 6.0, b) and not crossed_soft(1, 4.99, b)


def _standing(scope: str, id: str, spent: float, period: str = "day", usd: float = 10) -> Standing:
    b = Budget(usd=usd, period=period, soft_share=0.5)  # type: ignore[arg-type]
    return Standing(scope, id, "t", b, spent, window(b.period, NOW))  # type: ignore[arg-type]


def test_the_refusal_names_the_spent_budget_that_resets_last() -> None:
    key_day = _standing("key", "k1", 11, "day")
    tenant_month = _standing("tenant", "t", 50, "month", usd=40)
    assert refusal([key_day, _standing("tenant", "t", 1, "month")]) == key_day
    assert refusal([key_day, tenant_month]) == tenant_month  # the call may go only once both reset
    assert refusal([_standing("key", "k1", 9.99)]) is None
    assert refusal([]) is None


def test_retry_after_is_the_seconds_until_the_window_resets() -> None:
    s = _standing("key", "k1", 11, "day")
    assert s.retry_after_s(NOW) == 6 * 3600  # 18:00 to midnight UTC
    assert s.retry_after_s(s.window.end - 0.2) == 1  # never 0
    assert "which resets at 2026-12-04T00:00:00Z" in s.describe()


def test_the_soft_share_is_due_once_per_budget_and_window() -> None:
    alerts = SoftAlerts()
    assert alerts.due([_standing("tenant", "t", 4.0)]) == []  # under the share
    crossing = _standing("tenant", "t", 6.0)
    assert alerts.due([crossing, _standing("key", "k1", 1.0)]) == [crossing]
    assert alerts.due([_standing("tenant", "t", 7.0)]) == []  # the same window: said already
    refused = _standing("tenant", "t", 12.0)
    assert alerts.due([refused]) == []  # spent outright is past the soft share too: still once
    other = _standing("key", "k2", 11.0)  # a budget spent in one step is announced as well
    assert alerts.due([other]) == [other]
    next_day = Standing("tenant", "t", "t", crossing.budget, 6.0, window("day", NOW + 86_400))
    assert alerts.due([next_day]) == [next_day]  # a new window: due again


def test_a_failed_announcement_is_due_again() -> None:
    alerts = SoftAlerts()
    s = _standing("key", "k1", 6.0)
    assert alerts.due([s]) == [s]
    alerts.retry(s)
    assert alerts.due([s]) == [s]
    alerts.forget_before(s.window.first + 1)
    assert alerts.due([s]) == [s]
