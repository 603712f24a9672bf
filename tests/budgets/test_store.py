"""The shared spend tables: additive upserts, totals from a day on, the soft-limit claim that one
process wins, pruning, and the DSN forms of `keys.store`."""

from __future__ import annotations

from pathlib import Path

import pytest

from budgets.periods import Window
from budgets.store import SpendStore, sqlite_path
from contracts.errors import ConfigError


def test_adds_accumulate_per_scope_id_and_day(tmp_path: Path) -> None:
    store = SpendStore(tmp_path / "keys.db")
    store.add([("tenant", "acme", 100, 0.5), ("key", "k1", 100, 0.5)])
    store.add([("tenant", "acme", 100, 0.25), ("tenant", "acme", 101, 1.0)])
    assert store.days(0) == [("key", "k1", 100, 0.5), ("tenant", "acme", 100, 0.75), ("tenant", "acme", 101, 1.0)]
    day_101, days_100_106, day_99 = Window("day", 101, 101), Window("week", 100, 106), Window("day", 99, 99)
    assert sorted(store.totals([day_101, days_100_106, day_99])) == [
        ("key", "k1", (0.0, 0.5, 0.0)), ("tenant", "acme", (1.0, 1.75, 0.0))]
    assert store.totals([]) == []
    store.prune(101)
    assert store.days(0) == [("tenant", "acme", 101, 1.0)]
    store.close()


def test_a_write_fails_whole(tmp_path: Path) -> None:
    store = SpendStore(tmp_path / "keys.db")
    with pytest.raises(Exception):  # noqa: B017 (sqlite3's own error type for a bad row)
        store.add([("tenant", "acme", 100, 1.0), ("tenant", None, 100, 1.0)])  # type: ignore[list-item]
    assert store.days(0) == []
    store.close()


def test_exactly_one_process_claims_a_soft_alert_per_window(tmp_path: Path) -> None:
    a, b = SpendStore(tmp_path / "keys.db"), SpendStore(tmp_path / "keys.db")
    assert a.claim_alert("tenant", "acme", "day", 100, 1.0)
    assert not b.claim_alert("tenant", "acme", "day", 100, 2.0)
    assert not a.claim_alert("tenant", "acme", "day", 100, 3.0)
    assert b.claim_alert("tenant", "acme", "day", 101, 4.0)  # the next window
    assert b.claim_alert("tenant", "acme", "month", 100, 4.0)  # another budget period
    a.close()
    b.close()


@pytest.mark.parametrize(("dsn", "expected"), [
    pytest.param(None, "run/keys.db", id="default"),
    pytest.param("sqlite:///ledger/spend.db", "run/ledger/spend.db", id="relative-under-run-dir"),
    pytest.param("sqlite:////var/lib/modelyard/keys.db", "/var/lib/modelyard/keys.db", id="absolute"),
])
def test_dsns(dsn: str | None, expected: str) -> None:
    assert sqlite_path(dsn, "run") == Path(expected)


def test_other_dsns_are_a_clear_config_error() -> None:
    with pytest.raises(ConfigError, match="keys.store.*postgresql"):
        sqlite_path("postgresql://gw@db:5432/modelyard", "run")
    with pytest.raises(ConfigError, match="needs a file path"):
        sqlite_path("sqlite:///", "run")
