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
from typing import Protocol, TypeVar

from extproc.tasks import state
from extproc.tasks.state import TaskRecord

# A transition: the new record, or None to leave the stored one as it is.
Transition = Callable[[TaskRecord], "TaskRecord | None"]
_T = TypeVar("_T")
# Claim looks at this many of the oldest candidates per call.
_CLAIM_SCAN = 16


class TaskStore(Protocol):
    async def create(self, rec: TaskRecord) -> None: ...
    async def create_many(self, recs: list[TaskRecord]) -> None: ...  # all or none (a batch's lines)
    async def get_many(self, task_ids: list[str]) -> dict[str, TaskRecord]: ...  # those found, results included
    async def get(self, task_id: str, *, with_body: bool = False) -> TaskRecord | None: ...
    async def update(self, task_id: str, change: Transition) -> TaskRecord | None: ...
    async def claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None: ...
    async def purge(self, now: float, ttl_s: float) -> int: ...
    async def owed_webhooks(self, limit: int) -> list[TaskRecord]: ...
    async def close(self) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    lease_until REAL NOT NULL,
    completed_at REAL,
    doc BLOB NOT NULL,
    body BLOB NOT NULL,
    result BLOB,
    owes_webhook INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS tasks_open ON tasks (status, created_at);
CREATE INDEX IF NOT EXISTS tasks_webhooks ON tasks (owes_webhook) WHERE owes_webhook = 1;
"""


def open_durable(path: str, schema: str) -> sqlite3.Connection:
    """One connection shared by a store's threads (under its lock), autocommit, WAL, and a commit that
    survives a power cut, not only a crash: what the gateway accepted (a task, a batch) stays accepted."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.executescript(schema)
    return db


class SqliteTaskStore:
    """One file, one connection, one lock; every call runs in a thread."""

    def __init__(self, path: str) -> None:
        self._db = open_durable(path, _SCHEMA)
        self._lock = threading.Lock()

    def _save(self, rec: TaskRecord) -> None:
        """Everything but the request body, which never changes after `create`."""
        self._db.execute("UPDATE tasks SET status = ?, lease_until = ?, completed_at = ?, doc = ?, result = ?, "
                         "owes_webhook = ? WHERE id = ?",
                         (rec.status, rec.lease_until, rec.completed_at, state.to_doc(rec), rec.result,
                          int(state.owes_webhook(rec)), rec.id))

    def _read(self, task_id: str, with_body: bool = False) -> TaskRecord | None:
        cols = "doc, result, body" if with_body else "doc, result"
        row = self._db.execute(f"SELECT {cols} FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            return None
        return state.from_doc(row[0], row[2] if with_body else None, row[1])

    def _transaction(self, work: Callable[[], _T]) -> _T:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = work()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _create(self, rec: TaskRecord) -> None:
        def work() -> None:
            if self._db.execute("SELECT 1 FROM tasks WHERE id = ?", (rec.id,)).fetchone():
                raise ValueError(f"task {rec.id} exists")
            self._db.execute("INSERT INTO tasks (id, status, created_at, lease_until, completed_at, doc, body, result) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             (rec.id, rec.status, rec.created_at, rec.lease_until, rec.completed_at,
                              state.to_doc(rec), rec.request.body, rec.result))

        self._transaction(work)

    def _create_many(self, recs: list[TaskRecord]) -> None:
        def work() -> None:
            self._db.executemany(
                "INSERT INTO tasks (id, status, created_at, lease_until, completed_at, doc, body, result) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.id, r.status, r.created_at, r.lease_until, r.completed_at, state.to_doc(r), r.request.body,
                  r.result) for r in recs])

        self._transaction(work)  # one fsync for a whole batch's lines; a duplicate id refuses them all

    def _get_many(self, task_ids: list[str]) -> dict[str, TaskRecord]:
        with self._lock:
            return {rec.id: rec for task_id in task_ids if (rec := self._read(task_id)) is not None}

    def _get(self, task_id: str, with_body: bool) -> TaskRecord | None:
        with self._lock:
            return self._read(task_id, with_body)

    def _update(self, task_id: str, change: Transition) -> TaskRecord | None:
        def work() -> TaskRecord | None:
            rec = self._read(task_id)
            new = change(rec) if rec is not None else None
            if new is not None:
                self._save(new)
            return new

        return self._transaction(work)

    def _claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None:
        def work() -> TaskRecord | None:
            rows = self._db.execute(
                "SELECT id FROM tasks WHERE status = 'queued' OR (status = 'running' AND lease_until < ?) "
                "ORDER BY created_at LIMIT ?", (now, _CLAIM_SCAN)).fetchall()
            for (task_id,) in rows:
                rec = self._read(task_id, with_body=True)
                assert rec is not None
                new = state.claim(rec, now, owner, lease_s)
                if new is not rec:
                    self._save(new)
                    return new
            return None

        return self._transaction(work)

    def _purge(self, now: float, ttl_s: float) -> int:
        with self._lock:
            cur = self._db.execute("DELETE FROM tasks WHERE status IN ('succeeded', 'failed', 'cancelled') "
                                   "AND completed_at < ?", (now - ttl_s,))
            return cur.rowcount

    async def create(self, rec: TaskRecord) -> None:
        await asyncio.to_thread(self._create, rec)

    async def get(self, task_id: str, *, with_body: bool = False) -> TaskRecord | None:
        return await asyncio.to_thread(self._get, task_id, with_body)

    async def create_many(self, recs: list[TaskRecord]) -> None:
        await asyncio.to_thread(self._create_many, recs)

    async def get_many(self, task_ids: list[str]) -> dict[str, TaskRecord]:
        return await asyncio.to_thread(self._get_many, task_ids)

    async def update(self, task_id: str, change: Transition) -> TaskRecord | None:
        return await asyncio.to_thread(self._update, task_id, change)

    async def claim_next(self, now: float, owner: str, lease_s: float) -> TaskRecord | None:
        return await asyncio.to_thread(self._claim_next, now, owner, lease_s)

    async def purge(self, now: float, ttl_s: float) -> int:
        return await asyncio.to_thread(self._purge, now, ttl_s)

    def _owed_webhooks(self, limit: int) -> list[TaskRecord]:
        with self._lock:
            rows = self._db.execute("SELECT id FROM tasks WHERE owes_webhook = 1 ORDER BY completed_at LIMIT ?",
                                    (limit,)).fetchall()
            return [rec for (task_id,) in rows if (rec := self._read(task_id)) is not None]

    async def owed_webhooks(self, limit: int) -> list[TaskRecord]:
        return await asyncio.to_thread(self._owed_webhooks, limit)

    async def close(self) -> None:
        def _close() -> None:
            with self._lock:
                self._db.close()

        await asyncio.to_thread(_close)
