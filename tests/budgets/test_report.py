"""Spend reports: rows per key, tenant or model; spend is the exact sum of the metering rows."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from budgets.report import MeteredCall, read_calls, render_table, spend_report

CALLS = [
    MeteredCall(10.0, "key_a", "acme", "gpt", 10, 20, 0.1),
    MeteredCall(11.0, "key_a", "acme", "claude", 5, 5, 0.2),
    MeteredCall(12.0, None, "acme", "gpt", 1, 1, 0.7),  # a config-file key
    MeteredCall(13.0, "key_b", "beta", "gpt", 100, 0, 0.3),
    MeteredCall(5.0, "key_b", "beta", "gpt", 1, 1, 9.0),  # before --since
]


def test_by_key_groups_per_key_and_config_keys_per_tenant() -> None:
    rows = spend_report(CALLS, "key", since=10.0)
    assert [(r.key_id, r.tenant, r.model, r.requests, r.tokens) for r in rows] == [
        (None, "acme", None, 1, 2), ("key_a", "acme", None, 2, 40), ("key_b", "beta", None, 1, 100)]
    assert [r.spend_usd for r in rows] == [0.7, math.fsum([0.1, 0.2]), 0.3]  # 0.30000000000000004 first


def test_by_tenant_and_by_model() -> None:
    by_tenant = {r.tenant: (r.requests, r.tokens, r.spend_usd) for r in spend_report(CALLS, "tenant")}
    assert by_tenant == {"acme": (3, 42, math.fsum([0.1, 0.2, 0.7])), "beta": (2, 102, 9.3)}
    by_model = spend_report(CALLS, "model", since=10.0)
    assert [(r.model, r.key_id, r.tenant, r.requests) for r in by_model] == [("gpt", None, None, 3),
                                                                             ("claude", None, None, 1)]
    assert by_model[0].spend_usd == math.fsum([0.1, 0.7, 0.3])


def test_spend_is_exact_whatever_the_row_order() -> None:
    costs = [0.1] * 10 + [1e-9] * 1000 + [3.3]
    calls = [MeteredCall(1.0, None, "t", "m", 0, 0, c) for c in costs]
    forward = spend_report(calls, "tenant")[0].spend_usd
    backward = spend_report(list(reversed(calls)), "tenant")[0].spend_usd
    assert forward == backward == math.fsum(costs)


def test_an_unknown_grouping_is_refused() -> None:
    with pytest.raises(ValueError, match="--by must be one of key, tenant, model"):
        spend_report(CALLS, "team")  # type: ignore[arg-type]


def test_reads_several_stores_and_one_from_before_key_ids(tmp_path: Path) -> None:
    old, new = tmp_path / "old.sqlite", tmp_path / "new.sqlite"
    with sqlite3.connect(old) as conn:
        conn.execute("CREATE TABLE requests (ts REAL, task_id TEXT, tenant TEXT, model TEXT, input_tokens INTEGER, "
                     "output_tokens INTEGER, cost REAL)")
        conn.execute("INSERT INTO requests VALUES (1.0, 'a', 'acme', 'gpt', 1, 2, 0.5)")
    with sqlite3.connect(new) as conn:
        conn.execute("CREATE TABLE requests (ts REAL, task_id TEXT, tenant TEXT, model TEXT, input_tokens INTEGER, "
                     "output_tokens INTEGER, cost REAL, key_id TEXT)")
        conn.executemany("INSERT INTO requests VALUES (?, ?, 'acme', 'gpt', 1, 1, ?, ?)",
                         [(2.0, "b", 0.25, "key_a"), (3.0, "c", None, None)])
    calls = list(read_calls([old, new]))
    assert [(c.key_id, c.cost, c.input_tokens + c.output_tokens) for c in calls] == [
        (None, 0.5, 3), ("key_a", 0.25, 2), (None, 0.0, 2)]
    assert [c.ts for c in read_calls([old, new], since=2.0)] == [2.0, 3.0]
    table = render_table(spend_report(calls, "key"))
    assert table.splitlines()[0].split() == ["key_id", "tenant", "model", "requests", "tokens", "cache_read",
                                             "cache_write", "spend_usd", "cache_saved_usd"]
    assert "0.500000" in table and "key_a" in table
    with pytest.raises(FileNotFoundError, match="no metering database"):
        list(read_calls([tmp_path / "missing.sqlite"]))


def test_the_cli_prints_the_report_and_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from modelyard.cli import main

    db = tmp_path / "m.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE requests (ts REAL, task_id TEXT, tenant TEXT, model TEXT, input_tokens INTEGER, "
                     "output_tokens INTEGER, cost REAL, key_id TEXT)")
        conn.executemany("INSERT INTO requests VALUES (?, 't', ?, 'gpt', 1, 2, ?, ?)",
                         [(1e10, "acme", 0.1, "key_a"), (1e10, "acme", 0.2, "key_a"), (1.0, "acme", 5.0, None)])
    assert main(["spend", "--by", "key", "--json", "--since", "2001-01-01", "--metering-db", str(db)]) == 0
    assert json.loads(capsys.readouterr().out) == [{"key_id": "key_a", "tenant": "acme", "model": None,
                                                    "requests": 2, "tokens": 6, "spend_usd": math.fsum([0.1, 0.2]),
                                                    "cache_read_tokens": 0, "cache_write_tokens": 0, "saved_usd": 0.0}]
    assert main(["spend", "--by", "tenant", "--metering-db", str(db)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split() == ["-", "acme", "-", "3", "9", "0", "0", "5.300000", "0.000000"]
    assert main(["spend", "--since", "last tuesday", "--metering-db", str(db)]) == 2
    assert "--since 'last tuesday'" in capsys.readouterr().err
    assert main(["spend", "--metering-db", str(tmp_path / "none.sqlite")]) == 2
    assert "no metering database" in capsys.readouterr().err


def test_the_report_shows_what_the_prompt_cache_saved(tmp_path) -> None:
    """Issue 39: a store with the cache columns (the metering migration's) sums reads, writes and savings."""
    db = tmp_path / "m.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE requests (ts REAL, task_id TEXT, tenant TEXT, model TEXT, input_tokens INTEGER, "
                     "output_tokens INTEGER, cost REAL, key_id TEXT, cache_read_tokens INTEGER, "
                     "cache_write_tokens INTEGER, cache_write_1h_tokens INTEGER, cache_saved REAL)")
        conn.executemany("INSERT INTO requests VALUES (1.0, ?, 'acme', 'claude', 2006, 300, ?, NULL, ?, ?, 0, ?)",
                         [("a", 0.0055, 1920, 80, 0.0050), ("b", 0.002, 0, 0, 0.0), ("c", 0.001, 0, 100, -0.0001)])
    [row] = spend_report(read_calls([db]), "model")
    assert (row.cache_read_tokens, row.cache_write_tokens) == (1920, 180)
    assert row.saved_usd == math.fsum([0.0050, 0.0, -0.0001])
    assert "0.004900" in render_table([row])


def test_by_channel_and_by_cluster() -> None:
    """How much dearer is the fast channel: spend per channel, and per deployment with its channel."""
    calls = [MeteredCall(1.0, None, "t", "gpt", 10, 10, 0.5, channel="fast", cluster="gpt-fast"),
             MeteredCall(2.0, None, "t", "gpt", 10, 10, 0.1, channel="standard", cluster="gpt-a"),
             MeteredCall(3.0, None, "t", "gpt", 10, 10, 0.2, channel="standard", cluster="gpt-b"),
             MeteredCall(4.0, None, "u", "gpt", 10, 10, 0.25, channel="fast", cluster="gpt-fast")]
    by_channel = spend_report(calls, "channel")
    assert [(r.channel, r.cluster, r.requests, r.spend_usd) for r in by_channel] == [
        ("fast", None, 2, 0.75), ("standard", None, 2, math.fsum([0.1, 0.2]))]
    by_cluster = spend_report(calls, "cluster")
    assert [(r.cluster, r.channel, r.spend_usd) for r in by_cluster] == [
        ("gpt-fast", "fast", 0.75), ("gpt-b", "standard", 0.2), ("gpt-a", "standard", 0.1)]
    table = render_table(by_cluster).splitlines()
    assert table[0].split()[:5] == ["key_id", "tenant", "model", "channel", "cluster"]
    assert table[1].split()[3:5] == ["fast", "gpt-fast"]
    assert by_cluster[0].as_dict()["cluster"] == "gpt-fast" and "cluster" not in spend_report(calls, "tenant")[0].as_dict()
