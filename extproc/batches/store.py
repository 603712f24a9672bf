"""The files and batch records, in SQLite (the embedded default): every call runs in a thread, so
the event loop never waits on the disk. Every read names the tenant: another tenant's file or
batch is simply not found.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from extproc.batches import record
from extproc.batches.files import FileRecord
from extproc.batches.record import BatchRecord
from extproc.tasks.store import open_durable

_T = TypeVar("_T")
Change = Callable[[BatchRecord], "BatchRecord | None"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    purpose TEXT NOT NULL,
    filename TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_tenant ON files (tenant, created_at);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    api TEXT NOT NULL,
    open INTEGER NOT NULL,
    created_at REAL NOT NULL,
    doc BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_tenant ON batches (tenant, api, created_at);
CREATE INDEX IF NOT EXISTS batches_open ON batches (open) WHERE open = 1;
"""


class SqliteBatchStore:
    def __init__(self, path: str) -> None:
        self._db = open_durable(path, _SCHEMA)
        self._lock = threading.Lock()

    def _page(self, table: str, sql: str, args: list[object], tenant: str, after: str | None,
              limit: int) -> list[Any]:
        """`sql` (the tenant's rows) newest first, from past `after` (an id of the previous page), one row
        over `limit` so the caller can say whether more follow."""
        if after:
            row = self._db.execute(f"SELECT created_at FROM {table} WHERE id = ? AND tenant = ?",
                                   (after, tenant)).fetchone()
            if row:
                sql += " AND (created_at < ? OR (created_at = ? AND id < ?))"
                args = [*args, row[0], row[0], after]
        return self._db.execute(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", [*args, limit + 1]).fetchall()

    def _run(self, work: Callable[[], _T], transaction: bool = False) -> _T:
        with self._lock:
            if not transaction:
                return work()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = work()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    async def _call(self, work: Callable[[], _T], transaction: bool = False) -> _T:
        return await asyncio.to_thread(self._run, work, transaction)

    # -- files ---------------------------------------------------------------------------------
    async def put_file(self, rec: FileRecord, data: bytes, max_files: int | None = None) -> bool:
        """Stored (replacing one of the same id); False when the tenant already holds `max_files`."""
        def work() -> bool:
            if max_files is not None:
                (n,) = self._db.execute("SELECT COUNT(*) FROM files WHERE tenant = ?", (rec.tenant,)).fetchone()
                if n >= max_files:
                    return False
            self._db.execute("INSERT OR REPLACE INTO files (id, tenant, purpose, filename, bytes, created_at, data) "
                             "VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (rec.id, rec.tenant, rec.purpose, rec.filename, rec.bytes, rec.created_at, data))
            return True

        return await self._call(work, transaction=True)

    @staticmethod
    def _file(row: tuple[str, str, str, str, int, float]) -> FileRecord:
        return FileRecord(*row)

    async def get_file(self, file_id: str, tenant: str) -> FileRecord | None:
        def work() -> FileRecord | None:
            row = self._db.execute("SELECT id, tenant, purpose, filename, bytes, created_at FROM files "
                                   "WHERE id = ? AND tenant = ?", (file_id, tenant)).fetchone()
            return self._file(row) if row else None

        return await self._call(work)

    async def file_data(self, file_id: str, tenant: str) -> bytes | None:
        def work() -> bytes | None:
            row = self._db.execute("SELECT data FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).fetchone()
            return bytes(row[0]) if row else None

        return await self._call(work)

    async def list_files(self, tenant: str, purpose: str | None, limit: int, after: str | None
                         ) -> tuple[list[FileRecord], bool]:
        """Newest first, as OpenAI lists; `after` an id of the previous page."""
        def work() -> tuple[list[FileRecord], bool]:
            sql = "SELECT id, tenant, purpose, filename, bytes, created_at FROM files WHERE tenant = ?"
            args: list[object] = [tenant]
            if purpose:
                sql += " AND purpose = ?"
                args.append(purpose)
            rows = [self._file(r) for r in self._page("files", sql, args, tenant, after, limit)]
            return rows[:limit], len(rows) > limit

        return await self._call(work)

    async def delete_file(self, file_id: str, tenant: str) -> bool:
        def work() -> bool:
            return self._db.execute("DELETE FROM files WHERE id = ? AND tenant = ?", (file_id, tenant)).rowcount > 0

        return await self._call(work, transaction=True)

    # -- batches -------------------------------------------------------------------------------
    async def create_batch(self, rec: BatchRecord) -> None:
        def work() -> None:
            self._db.execute("INSERT INTO batches (id, tenant, api, open, created_at, doc) VALUES (?, ?, ?, ?, ?, ?)",
                             (rec.id, rec.tenant, rec.api, int(rec.open), rec.created_at, record.to_doc(rec)))

        await self._call(work, transaction=True)

    def _read(self, batch_id: str) -> BatchRecord | None:
        row = self._db.execute("SELECT doc FROM batches WHERE id = ?", (batch_id,)).fetchone()
        return record.from_doc(row[0]) if row else None

    async def get_batch(self, batch_id: str, tenant: str) -> BatchRecord | None:
        def work() -> BatchRecord | None:
            rec = self._read(batch_id)
            return rec if rec is not None and rec.tenant == tenant else None

        return await self._call(work)

    async def read_batch(self, batch_id: str) -> BatchRecord | None:
        """Any tenant's: the finalizer's read, never a caller's."""
        return await self._call(lambda: self._read(batch_id))

    async def update_batch(self, batch_id: str, change: Change) -> BatchRecord | None:
        """`change` applied in one transaction; None (and nothing written) when it declines."""
        def work() -> BatchRecord | None:
            rec = self._read(batch_id)
            new = change(rec) if rec is not None else None
            if new is not None:
                self._db.execute("UPDATE batches SET open = ?, doc = ? WHERE id = ?",
                                 (int(new.open), record.to_doc(new), new.id))
            return new

        return await self._call(work, transaction=True)

    async def delete_batch(self, batch_id: str, tenant: str) -> bool:
        def work() -> bool:
            return self._db.execute("DELETE FROM batches WHERE id = ? AND tenant = ? AND open = 0",
                                    (batch_id, tenant)).rowcount > 0

        return await self._call(work, transaction=True)

    async def list_batches(self, tenant: str, api: str, limit: int, after: str | None
                           ) -> tuple[list[BatchRecord], bool]:
        def work() -> tuple[list[BatchRecord], bool]:
            sql = "SELECT doc FROM batches WHERE tenant = ? AND api = ?"
            args: list[object] = [tenant, api]
            rows = [record.from_doc(r[0]) for r in self._page("batches", sql, args, tenant, after, limit)]
            return rows[:limit], len(rows) > limit

        return await self._call(work)

    async def open_batches(self) -> list[str]:
        def work() -> list[str]:
            return [r[0] for r in self._db.execute("SELECT id FROM batches WHERE open = 1 ORDER BY created_at")]

        return await self._call(work)

    async def close(self) -> None:
        def work() -> None:
            self._db.close()

        await self._call(work)
