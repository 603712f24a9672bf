"""The embedded store: one SQLite file in the run dir (WAL, shared by a host's workers).

Reads run in one reader thread, writes (puts, eviction, purges) in one writer thread: nothing
blocks the event loop. Eviction: past `max_bytes`, expired entries go first, then those closest
to their expiry (with one TTL per model that is the oldest stored); a hit writes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from extproc.cache.entry import Entry
from extproc.cache.lookup import Probe, StoreStats, VectorRow

log = logging.getLogger("modelyard.rcache")

_SCHEMA = """CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY, tenant TEXT NOT NULL, model TEXT NOT NULL, stored_at REAL NOT NULL,
    expires_at REAL NOT NULL, size INTEGER NOT NULL, body BLOB NOT NULL)"""
# Semantic entries' vectors, in the order stored (seq): each process's index reads what is new.
_VECTORS = """CREATE TABLE IF NOT EXISTS vectors (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL UNIQUE, partition TEXT NOT NULL,
    expires_at REAL NOT NULL, vec BLOB NOT NULL)"""
_VECTOR_BATCH = 10_000
_QUEUE_LIMIT = 10_000  # puts waiting past this are dropped (a cache may forget; the loop must not wait)
_STOP = object()


def _open(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=5.0, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # a cache: a power cut may lose the last entries
    conn.execute(_SCHEMA)
    conn.execute(_VECTORS)
    conn.execute("CREATE INDEX IF NOT EXISTS entries_expiry ON entries (expires_at)")
    return conn


class SqliteResponseStore:
    def __init__(self, path: str | Path, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        _open(self.path).close()  # the schema now, so a bad path fails at start
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="rcache-read")
        self._read_conn: sqlite3.Connection | None = None
        self._q: queue.Queue[Any] = queue.Queue(_QUEUE_LIMIT)
        self._writer = threading.Thread(target=self._run, name="rcache-write", daemon=True)
        self._writer.start()

    # -- reads (reader thread) ------------------------------------------------------------
    def _read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        if self._read_conn is None:
            self._read_conn = _open(self.path)
        return self._read_conn.execute(sql, args).fetchall()

    async def get(self, probe: Probe, now: float) -> Entry | None:
        rows = await asyncio.get_running_loop().run_in_executor(
            self._reader, self._read, "SELECT tenant, model, stored_at, expires_at, body FROM entries WHERE key = ?",
            (probe.key,))
        if not rows:
            return None
        tenant, model, stored_at, expires_at, body = rows[0]
        return Entry(probe.key, tenant, model, stored_at, expires_at, bytes(body))

    async def vectors_since(self, cursor: str | None, now: float) -> tuple[list[VectorRow], str]:
        seq = int(cursor or 0)
        rows = await asyncio.get_running_loop().run_in_executor(
            self._reader, self._read, "SELECT seq, key, partition, expires_at, vec FROM vectors WHERE seq > ? "
            "ORDER BY seq LIMIT ?", (seq, _VECTOR_BATCH))
        if rows:
            seq = rows[-1][0]
        return [VectorRow(k, p, e, bytes(v)) for _, k, p, e, v in rows if e > now], str(seq)

    async def stats(self) -> StoreStats:
        return await asyncio.get_running_loop().run_in_executor(self._reader, self.stats_now)

    def stats_now(self) -> StoreStats:
        """The same, blocking (the CLI's)."""
        now = time.time()
        rows = self._read("SELECT model, tenant, COUNT(*), SUM(size) FROM entries WHERE expires_at > ? "
                          "GROUP BY model, tenant", (now,))
        by_model: dict[str, int] = {}
        by_tenant: dict[str, int] = {}
        for model, tenant, n, _ in rows:
            by_model[model] = by_model.get(model, 0) + n
            by_tenant[tenant] = by_tenant.get(tenant, 0) + n
        return StoreStats(sum(r[2] for r in rows), sum(r[3] or 0 for r in rows), self.max_bytes, by_model, by_tenant)

    # -- writes (writer thread) -----------------------------------------------------------
    def put(self, entry: Entry) -> None:
        try:
            self._q.put_nowait(entry)
        except queue.Full:
            log.warning("response cache: write queue full, entry not kept")

    async def purge(self, tenant: str | None = None, model: str | None = None) -> int:
        fut: Future[int] = Future()
        self._q.put(("purge", tenant, model, fut))
        return await asyncio.wrap_future(fut)

    def purge_now(self, tenant: str | None = None, model: str | None = None) -> int:
        """The same, blocking (the CLI's: another connection to the same file)."""
        with _open(self.path) as conn:
            return _purge(conn, tenant, model)

    def flush(self) -> None:
        """Wait for every queued write (tests and the close)."""
        fut: Future[int] = Future()
        self._q.put(("flush", None, None, fut))
        fut.result(timeout=30)

    def _run(self) -> None:
        conn = _open(self.path)
        while True:
            item = self._q.get()
            if item is _STOP:
                conn.close()
                return
            try:
                if isinstance(item, Entry):
                    batch = [item]
                    while len(batch) < 256:  # one commit for what queued meanwhile
                        try:
                            nxt = self._q.get_nowait()
                        except queue.Empty:
                            break
                        if not isinstance(nxt, Entry):
                            self._q.put(nxt)  # a command after the batch keeps its turn
                            break
                        batch.append(nxt)
                    self._insert(conn, batch)
                else:
                    op, tenant, model, fut = item
                    fut.set_result(_purge(conn, tenant, model) if op == "purge" else 0)
            except sqlite3.Error as e:
                log.warning("response cache: write failed: %s", e)
                if not isinstance(item, Entry):
                    item[3].set_exception(e)

    def _insert(self, conn: sqlite3.Connection, batch: list[Entry]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?, ?, ?, ?, ?)",
                             [(e.key, e.tenant, e.model, e.stored_at, e.expires_at, e.size, e.body) for e in batch])
            conn.executemany("INSERT OR REPLACE INTO vectors (key, partition, expires_at, vec) VALUES (?, ?, ?, ?)",
                             [(e.key, e.partition, e.expires_at, e.vector) for e in batch if e.vector])
            _evict(conn, self.max_bytes, time.time())
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    async def close(self) -> None:
        await asyncio.to_thread(self.close_now)

    def close_now(self) -> None:
        self._q.put(_STOP)
        self._writer.join(timeout=30)
        self._reader.shutdown(wait=True)


def _evict(conn: sqlite3.Connection, max_bytes: int, now: float) -> None:
    total = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
    if total <= max_bytes:
        return
    conn.execute("DELETE FROM entries WHERE expires_at <= ?", (now,))
    _drop_orphan_vectors(conn)
    total = conn.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()[0]
    over = total - max_bytes
    if over <= 0:
        return
    # Closest to expiry first, until the bound holds.
    doomed, freed = [], 0
    for key, size in conn.execute("SELECT key, size FROM entries ORDER BY expires_at"):
        doomed.append((key,))
        freed += size
        if freed >= over:
            break
    conn.executemany("DELETE FROM entries WHERE key = ?", doomed)
    _drop_orphan_vectors(conn)


def _drop_orphan_vectors(conn: sqlite3.Connection) -> None:
    """Vectors whose entry went (evicted, expired, purged) go with it."""
    conn.execute("DELETE FROM vectors WHERE key NOT IN (SELECT key FROM entries)")


def _purge(conn: sqlite3.Connection, tenant: str | None, model: str | None) -> int:
    where, args = [], []
    if tenant is not None:
        where.append("tenant = ?")
        args.append(tenant)
    if model is not None:
        where.append("model = ?")
        args.append(model)
    sql = "DELETE FROM entries" + (" WHERE " + " AND ".join(where) if where else "")
    n = conn.execute(sql, args).rowcount
    _drop_orphan_vectors(conn)
    return n
