"""The spend ledger's SQL on a real PostgreSQL (Debian's, started here; skipped without it): the
same upserts, window totals, once-only claims and pruning as on SQLite, through psycopg."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from budgets.periods import Window
from budgets.store import SpendStore
from tests.stack_config import free_port

psycopg = pytest.importorskip("psycopg")
_BIN = Path("/usr/lib/postgresql/15/bin")
_INITDB = shutil.which("initdb") or str(_BIN / "initdb")
_PG_CTL = shutil.which("pg_ctl") or str(_BIN / "pg_ctl")
pytestmark = pytest.mark.skipif(not Path(_INITDB).exists(), reason="PostgreSQL is not installed (apt-get install postgresql)")


def _as_owner(argv: list[str]) -> list[str]:
    # initdb refuses to run as root: run it as Debian's postgres user then
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    # Not under pytest's tmp dir: its parents are root's alone, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    data, port = root / "data", free_port()
    subprocess.run(_as_owner([_INITDB, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"]),
                   check=True, capture_output=True, timeout=60)
    subprocess.run(_as_owner([_PG_CTL, "-D", str(data), "-l", str(root / "log"), "-w", "-t", "30", "-o",
                              f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "start"]),
                   check=True, capture_output=True, timeout=60)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(_as_owner([_PG_CTL, "-D", str(data), "-m", "immediate", "stop"]), capture_output=True,
                       timeout=30)
        shutil.rmtree(root, ignore_errors=True)


def test_the_ledger_sql_runs_on_postgresql(dsn: str) -> None:
    a = SpendStore(psycopg.connect(dsn), paramstyle="format")
    b = SpendStore(psycopg.connect(dsn), paramstyle="format")  # another replica
    a.add([("tenant", "acme", 100, 0.5), ("key", "k1", 100, 0.25)])
    b.add([("tenant", "acme", 100, 0.25), ("tenant", "acme", 101, 1.0)])
    assert a.days(0) == [("key", "k1", 100, 0.25), ("tenant", "acme", 100, 0.75), ("tenant", "acme", 101, 1.0)]
    assert sorted(b.totals([Window("day", 101, 101), Window("week", 100, 106)])) == [
        ("key", "k1", (0.0, 0.25)), ("tenant", "acme", (1.0, 1.75))]
    assert a.claim_alert("tenant", "acme", "day", 100, 1.0)
    assert not b.claim_alert("tenant", "acme", "day", 100, 2.0)
    b.prune(101)
    assert a.days(0) == [("tenant", "acme", 101, 1.0)]
    a.close()
    b.close()


def test_a_broken_connection_is_replaced_at_the_next_call(dsn: str) -> None:
    """A PostgreSQL restart closes the ledger's connection: with `reconnect` the next write opens
    a new one (before: every later write failed until the gateway restarted)."""
    opened: list[object] = []

    def connect():
        opened.append(psycopg.connect(dsn, connect_timeout=5))
        return opened[-1]

    store = SpendStore(connect(), paramstyle="format", reconnect=connect)
    opened[0].close()  # what the server's restart leaves: a closed connection
    store.add([("key", "reconnect-test", 20000, 0.25)])
    assert len(opened) == 2
    assert ("key", "reconnect-test", 20000, 0.25) in store.days(20000)
    store.close()
