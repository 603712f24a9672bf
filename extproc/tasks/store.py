"""Durable task stores: the `TaskStore` interface and SQLite, the embedded default.

Every change is one pure transition from `state` applied inside a transaction, so two workers
(threads, processes or replicas) never both take a task. SQLite runs in a worker thread: the
event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from extproc.tasks import state
from extproc.tasks.state import TaskRecord

# A transition: the new record, or None to leave the stored one as it is.
Transition = Callable[[TaskRecord], "TaskRecord | None"]
# Claim looks at this many of the oldest candidates per call.
_CLAIM_SCAN = 16


class TaskStore(Protocol):
    async def create(self, rec: TaskRecord) -> None: ...
    async def get(self, task_id: str) -> TaskRecord | None: ...
    async def update(self, task_id: str, change: Transition) -> TaskRecord | None: ...
    async def claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None: ...
    async def purge(self, now: float, ttl_s: float) -> int: ...
    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_until REAL NOT NULL,
    completed_at REAL,
    doc BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS tasks_open ON tasks (status, created_at);
"""


class SqliteTaskStore:
    """One file, one connection, one lock; every call runs in a thread."""

    def __init__(self, path: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an accepted task survives a power cut, not only a crash
        self._db.executescript(_SCHEMA)
        self._lock = threading.Lock()

    def _write(self, rec: TaskRecord) -> None:
        self._db.execute("INSERT OR REPLACE INTO tasks (id, status, created_at, lease_until, completed_at, doc) "
                         "VALUES (?, ?, ?, ?, ?, ?)",
                         (rec.id, rec.status, rec.created_at, rec.lease_until, rec.completed_at, state.to_bytes(rec)))

    def _read(self, task_id: str) -> TaskRecord | None:
        row = self._db.execute("SELECT doc FROM tasks WHERE id = ?", (task_id,)).fetchone()
        return state.from_bytes(row[0]) if row else None

    def _create(self, rec: TaskRecord) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._read(rec.id) is not None:
                    raise ValueError(f"task {rec.id} exists")
                self._write(rec)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _get(self, task_id: str) -> TaskRecord | None:
        with self._lock:
            return self._read(task_id)

    def _update(self, task_id: str, change: Transition) -> TaskRecord | None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rec = self._read(task_id)
                new = change(rec) if rec is not None else None
                if new is not None:
                    self._write(new)
                self._db.execute("COMMIT")
                return new
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = self._db.execute(
                    "SELECT doc FROM tasks WHERE status = 'queued' OR (status = 'running' AND lease_until < ?) "
                    "ORDER BY created_at LIMIT ?", (now, _CLAIM_SCAN)).fetchall()
                for (doc,) in rows:
                    rec = state.from_bytes(doc)
                    new = state.claim(rec, now, owner, lease_s)
                    if new is not rec:
                        self._write(new)
                        self._db.execute("COMMIT")
                        return new
                self._db.execute("COMMIT")
                return None
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def _purge(self, now: float, ttl_s: float) -> int:
        with self._lock:
            cur = self._db.execute("DELETE FROM tasks WHERE status IN ('succeeded', 'failed', 'cancelled') "
                                   "AND completed_at < ?", (now - ttl_s,))
            return cur.rowcount

    async def create(self, rec: TaskRecord) -> None:
        await asyncio.to_thread(self._create, rec)

    async def get(self, task_id: str) -> TaskRecord | None:
        return await asyncio.to_thread(self._get, task_id)

    async def update(self, task_id: str, change: Transition) -> TaskRecord | None:
        return await asyncio.to_thread(self._update, task_id, change)

    async def claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None:
        return await asyncio.to_thread(self._claim_next, now, owner, lease_s)

    async def purge(self, now: float, ttl_s: float) -> int:
        return await asyncio.to_thread(self._purge, now, ttl_s)

    async def close(self) -> None:
        def _close() -> None:
            with self._lock:
                self._db.close()

        await asyncio.to_thread(_close)
