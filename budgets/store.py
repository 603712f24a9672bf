"""The spend ledger's shared tables, behind one small class: every worker and replica adds its
spend per (scope, id, UTC day) and reads everyone's totals back.

Plain SQL that SQLite (3.24+) and PostgreSQL both take (`ON CONFLICT ... DO UPDATE`, DOUBLE
PRECISION), written with `?` and turned into `%s` for a driver whose paramstyle says so (psycopg):
give `SpendStore` a path (SQLite, opened here) or any DB-API connection, such as the key store's
(`keys/db.py`). The DSN is the key store's (`keys.store`): `sqlite:///relative/path` (under the
run dir), `sqlite:////absolute/path`, or None for `<run dir>/keys.db`. Every method does I/O: call
them from a thread, never the event loop.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from budgets.periods import Window
from contracts.errors import ConfigError

DEFAULT_FILE = "keys.db"
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS budget_spend (
        scope TEXT NOT NULL, id TEXT NOT NULL, day INTEGER NOT NULL, usd DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, id, day))""",
    # One row per budget and window whose soft share was announced: whoever inserts it sends the webhook.
    """CREATE TABLE IF NOT EXISTS budget_alerts (
        scope TEXT NOT NULL, id TEXT NOT NULL, period TEXT NOT NULL, first_day INTEGER NOT NULL,
        sent_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (scope, id, period, first_day))""",
)
_ADD = ("INSERT INTO budget_spend (scope, id, day, usd) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (scope, id, day) DO UPDATE SET usd = budget_spend.usd + excluded.usd")
_CLAIM = ("INSERT INTO budget_alerts (scope, id, period, first_day, sent_at) VALUES (?, ?, ?, ?, ?) "
          "ON CONFLICT (scope, id, period, first_day) DO NOTHING")


def sqlite_path(dsn: str | None, run_dir: str | Path) -> Path:
    """The SQLite file a `keys.store` DSN names (ConfigError for any other kind of DSN)."""
    if dsn is None:
        return Path(run_dir) / DEFAULT_FILE
    if not dsn.startswith("sqlite:///"):
        scheme = dsn.partition(":")[0]
        raise ConfigError(f"keys.store: the spend ledger opens sqlite:///path DSNs here, not {scheme}: "
                          "(PostgreSQL comes with the key store's connection, keys/db.py)")
    rest = dsn[len("sqlite:///"):]
    if not rest.strip("/"):
        raise ConfigError("keys.store: sqlite:/// needs a file path")
    path = Path(rest)
    return path if path.is_absolute() else Path(run_dir) / path


class SpendStore:
    """One connection, used by one thread at a time (the ledger's sync thread). With `reconnect`
    (PostgreSQL), a connection that broke (the server restarted) is replaced at the next call."""

    def __init__(self, target: str | Path | Any, *, paramstyle: str = "qmark", timeout_s: float = 5.0,
                 reconnect: Callable[[], Any] | None = None):
        if isinstance(target, (str, Path)):
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            # check_same_thread off: built on the starting thread, then used by the sync thread alone.
            conn = sqlite3.connect(path, timeout=timeout_s, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")  # workers read while another writes
            conn.execute("PRAGMA synchronous=NORMAL")
            paramstyle = "qmark"
        else:
            conn = target
        self._conn = conn
        self._reconnect = reconnect
        self._format = paramstyle in ("format", "pyformat")
        for stmt in _SCHEMA:
            self._run(stmt)
        self._conn.commit()

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._format else sql

    def _live(self) -> Any:
        """The connection, opened again first when the old one broke (raises while the server is down)."""
        if self._reconnect is not None and _dead(self._conn):
            self._conn = self._reconnect()
        return self._conn

    def _rollback(self) -> None:
        if not _dead(self._conn):  # a dead connection has no transaction left to end
            self._conn.rollback()

    def _run(self, sql: str, args: Sequence[object] = ()) -> Any:
        cur = self._live().cursor()
        cur.execute(self._sql(sql), args)
        return cur

    def add(self, rows: Iterable[tuple[str, str, int, float]]) -> None:
        """Add (scope, id, day, usd) to the totals, all in one transaction."""
        try:
            self._live().cursor().executemany(self._sql(_ADD), list(rows))
            self._conn.commit()
        except BaseException:
            self._rollback()
            raise

    def totals(self, windows: Sequence[Window]) -> list[tuple[str, str, tuple[float, ...]]]:
        """Per (scope, id), the spend every worker and replica stored in each of `windows`: one row
        per budget holder, however many days its windows span."""
        if not windows:
            return []
        sums = ", ".join("SUM(CASE WHEN day BETWEEN ? AND ? THEN usd ELSE 0 END)" for _ in windows)
        args: list[int] = [d for w in windows for d in (w.first, w.last)]
        cur = self._run(f"SELECT scope, id, {sums} FROM budget_spend WHERE day >= ? GROUP BY scope, id",
                        (*args, min(w.first for w in windows)))
        rows = [(scope, id, tuple(float(v or 0.0) for v in usd)) for scope, id, *usd in cur.fetchall()]
        self._conn.commit()  # end the read transaction: the next read sees newer writes
        return rows

    def days(self, since_day: int) -> list[tuple[str, str, int, float]]:
        """Every stored (scope, id, day, usd) from `since_day` on (tests and inspection)."""
        rows = self._run("SELECT scope, id, day, usd FROM budget_spend WHERE day >= ? ORDER BY scope, id, day",
                         (since_day,)).fetchall()
        self._conn.commit()
        return rows

    def claim_alert(self, scope: str, id: str, period: str, first_day: int, now: float) -> bool:
        """True for exactly one caller per (scope, id, period, window) across every process."""
        try:
            cur = self._run(_CLAIM, (scope, id, period, first_day, now))
            self._conn.commit()
        except BaseException:
            self._rollback()
            raise
        return cur.rowcount == 1

    def prune(self, before_day: int) -> None:
        """Drop days no budget window can hold any more (reports read the metering store)."""
        self._run("DELETE FROM budget_spend WHERE day < ?", (before_day,))
        self._run("DELETE FROM budget_alerts WHERE first_day < ?", (before_day,))
        self._conn.commit()

    def close(self) -> None:
        self._conn.close()


def _dead(conn: Any) -> bool:
    """psycopg's word for a connection that can no longer be used (sqlite3's never dies)."""
    return bool(getattr(conn, "closed", False) or getattr(conn, "broken", False))
