"""One small DB layer over SQLite and PostgreSQL (psycopg 3): SQL is written once with `?`
placeholders and portable types; `connect(dsn)` picks the driver from the DSN's scheme. Values go
in parameters only: `?` becomes psycopg's `%s`, so SQL text holds no literal `?` or `%`.

Every call is blocking: callers on an event loop run it in a thread. One connection per
`Database`, guarded by a lock, so threads may share it; a broken PostgreSQL connection is
reopened on the next call.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

Dialect = Literal["sqlite", "postgresql"]
Row = tuple[Any, ...]


class StoreError(Exception):
    """The store cannot be reached or refused a statement (the message names which)."""


class Database:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.dialect: Dialect = "postgresql" if dsn.startswith(("postgresql://", "postgres://")) else "sqlite"
        self._lock = threading.RLock()
        self._conn: Any = None
        with self._lock:
            self._connection()

    # -- statements ----------------------------------------------------------------------------

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        with self._lock:
            return int(self._run(sql, params, lambda cur: cur.rowcount))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement over many parameter rows (a writer's batch); wrap it in `transaction()`
        to commit them together."""
        with self._lock:
            conn = self._connection()
            if self.dialect == "sqlite":
                try:
                    conn.executemany(sql, [tuple(r) for r in rows])
                except sqlite3.Error as e:
                    raise StoreError(f"key store: {e}") from None
                return
            with self._guard(), conn.cursor() as cur:
                cur.executemany(sql.replace("?", "%s"), [tuple(r) for r in rows])

    def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        with self._lock:
            rows = self._run(sql, params, lambda cur: cur.fetchall())
            return [tuple(r) for r in rows]

    def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        with self._lock:
            row = self._run(sql, params, lambda cur: cur.fetchone())
            return None if row is None else tuple(row)

    @contextmanager
    def transaction(self, lock: str | None = None) -> Iterator[Database]:
        """Statements inside commit together. `lock` (a table): writers of it are serialised for
        the transaction, so values they derive from the table (a version counter) come in commit order."""
        with self._lock:
            conn = self._connection()
            if self.dialect == "sqlite":
                try:
                    conn.execute("BEGIN IMMEDIATE")  # takes SQLite's one write lock now, not at the first write
                except sqlite3.Error as e:
                    raise StoreError(f"key store: {e}") from None
                try:
                    yield self
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
            else:
                with self._guard(), conn.transaction():
                    if lock:
                        conn.execute(f"LOCK TABLE {lock} IN SHARE ROW EXCLUSIVE MODE")
                    yield self

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

    # -- private -------------------------------------------------------------------------------

    def _connection(self) -> Any:
        if self._conn is not None:
            return self._conn
        if self.dialect == "sqlite":
            path = sqlite_path(self.dsn)
            try:
                if path != ":memory:":
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
                conn.execute("PRAGMA busy_timeout = 10000")
                if path != ":memory:":
                    conn.execute("PRAGMA journal_mode = WAL")  # readers (every worker's refresh) never block a writer
            except (OSError, sqlite3.Error) as e:
                raise StoreError(f"key store {path}: {e}") from None
            self._conn = conn
        else:
            import psycopg

            try:
                self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
            except psycopg.Error as e:
                raise StoreError(f"key store {redacted(self.dsn)}: {str(e).strip()}") from None
        return self._conn

    def _run(self, sql: str, params: Sequence[Any], read: Any) -> Any:
        conn = self._connection()
        if self.dialect == "sqlite":
            try:
                return read(conn.execute(sql, tuple(params)))
            except sqlite3.Error as e:
                raise StoreError(f"key store: {e}") from None
        with self._guard(), conn.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), tuple(params))
            return read(cur)

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """psycopg's errors as StoreError; a connection that broke is dropped, reopened next time."""
        import psycopg

        try:
            yield
        except psycopg.Error as e:
            conn = self._conn
            if conn is not None and (conn.closed or conn.broken):
                self._conn = None
            raise StoreError(f"key store: {str(e).strip()}") from None


def sqlite_path(dsn: str) -> str:
    """`sqlite:///relative/or/abs` -> the path (`sqlite:////abs` and `sqlite:///:memory:` too)."""
    if not dsn.startswith("sqlite:///"):
        raise StoreError(f"key store {dsn!r}: expected sqlite:///PATH or postgresql://...")
    return dsn[len("sqlite:///"):]


def redacted(dsn: str) -> str:
    """The DSN without a password (it may hold one: postgresql://user:secret@host/db)."""
    scheme, sep, rest = dsn.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not sep or not at:
        return dsn
    return f"{scheme}://{userinfo.partition(':')[0]}@{host}"


def connect(dsn: str) -> Database:
    """A `Database` on `dsn`: sqlite:///PATH or postgresql://user@host:port/db."""
    if not dsn.startswith(("sqlite:///", "postgresql://", "postgres://")):
        raise StoreError(f"key store {redacted(dsn)!r}: expected sqlite:///PATH or postgresql://...")
    return Database(dsn)
