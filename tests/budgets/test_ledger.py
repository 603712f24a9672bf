"""The in-memory ledger: local spend counts at once, and exactly once across a write, a failed
write and the totals read back; two processes on one store see each other's spend."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from budgets.ledger import Ledger
from budgets.periods import PERIODS, day_of, window
from budgets.store import SpendStore

NOW = datetime(2026, 12, 3, 18, 0, tzinfo=UTC).timestamp()
DAY = window("day", NOW)
MONTH = window("month", NOW)
WINDOWS = [window(p, NOW) for p in PERIODS]


def _refresh(led: Ledger, store: SpendStore) -> None:
    led.install(WINDOWS, store.totals(WINDOWS))


def test_local_spend_counts_at_once_for_the_tenant_and_the_key() -> None:
    led = Ledger()
    led.add("acme", "key_1", 0.25, NOW)
    led.add("acme", None, 0.5, NOW)  # a config-file key: the tenant only
    led.add("acme", "key_1", 0.0, NOW)  # nothing to count
    assert led.spent("tenant", "acme", DAY) == 0.75
    assert led.spent("key", "key_1", DAY) == 0.25
    assert led.spent("key", "acme", DAY) == 0.0
    assert led.ids("key") == {"key_1"} and led.ids("tenant") == {"acme"}


def test_spend_falls_into_the_windows_of_its_day() -> None:
    led = Ledger()
    led.add("acme", None, 1.0, NOW)
    led.add("acme", None, 2.0, NOW - 86_400)  # yesterday: this month, not today
    led.add("acme", None, 4.0, NOW - 40 * 86_400)  # another month
    assert led.spent("tenant", "acme", DAY) == 1.0
    assert led.spent("tenant", "acme", MONTH) == 3.0


def test_a_flush_round_counts_everything_once(tmp_path: Path) -> None:
    store = SpendStore(tmp_path / "keys.db")
    led = Ledger()
    led.add("acme", "k", 1.0, NOW)
    batch = led.take()
    assert batch == {("tenant", "acme", day_of(NOW)): 1.0, ("key", "k", day_of(NOW)): 1.0}
    assert led.spent("tenant", "acme", DAY) == 1.0  # taken, still counted while it is written
    store.add([(s, i, d, usd) for (s, i, d), usd in batch.items()])
    led.add("acme", "k", 0.5, NOW)  # spent while the round runs
    assert led.spent("tenant", "acme", DAY) == 1.5  # stored, but not yet read back: counted once
    _refresh(led, store)
    assert led.spent("tenant", "acme", DAY) == 1.5 and led.spent("key", "k", DAY) == 1.5
    assert led.take() == {("tenant", "acme", day_of(NOW)): 0.5, ("key", "k", day_of(NOW)): 0.5}
    store.close()


def test_a_failed_write_is_retried_without_losing_or_doubling_spend(tmp_path: Path) -> None:
    store = SpendStore(tmp_path / "keys.db")
    led = Ledger()
    led.add("acme", None, 1.0, NOW)
    first = led.take()
    store.add([(s, i, d, usd) for (s, i, d), usd in first.items()])  # written; its totals never read
    led.add("acme", None, 2.0, NOW)
    second = led.take()
    led.restore(second)  # that write failed
    assert led.spent("tenant", "acme", DAY) == 3.0
    _refresh(led, store)  # holds the first write only
    assert led.spent("tenant", "acme", DAY) == 3.0
    third = led.take()
    assert third == second  # the failed spend goes out again
    store.add([(s, i, d, usd) for (s, i, d), usd in third.items()])
    _refresh(led, store)
    assert led.spent("tenant", "acme", DAY) == 3.0
    store.close()


def test_installed_totals_hold_each_window_and_a_new_day_starts_from_local_spend(tmp_path: Path) -> None:
    store = SpendStore(tmp_path / "keys.db")
    store.add([("tenant", "acme", day_of(NOW), 1.0), ("tenant", "acme", day_of(NOW) - 1, 2.0),
               ("tenant", "acme", day_of(NOW) - 40, 4.0), ("key", "k", day_of(NOW), 0.5)])
    led = Ledger()
    _refresh(led, store)
    week = window("week", NOW)
    assert (led.spent("tenant", "acme", DAY), led.spent("tenant", "acme", week),
            led.spent("tenant", "acme", MONTH)) == (1.0, 3.0, 3.0)
    assert led.spent("key", "k", DAY) == 0.5 and led.spent("key", "other", DAY) == 0.0
    tomorrow = window("day", NOW + 86_400)  # before the next round: nothing stored counts there yet
    led.add("acme", None, 0.25, NOW + 86_400)
    assert led.spent("tenant", "acme", tomorrow) == 0.25
    store.close()


def test_two_processes_on_one_store_see_each_others_spend(tmp_path: Path) -> None:
    a_store, b_store = SpendStore(tmp_path / "keys.db"), SpendStore(tmp_path / "keys.db")
    a, b = Ledger(), Ledger()
    a.add("acme", "k", 1.0, NOW)
    b.add("acme", "k", 2.0, NOW)
    for led, store in ((a, a_store), (b, b_store), (a, a_store)):
        store.add([(s, i, d, usd) for (s, i, d), usd in led.take().items()])
        _refresh(led, store)
    assert a.spent("key", "k", DAY) == 3.0 and b.spent("key", "k", DAY) == 3.0
    a_store.close()
    b_store.close()
