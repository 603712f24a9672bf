"""The SQLite files and batch store: every read names the tenant; bounds; pages."""

from __future__ import annotations

import asyncio
from pathlib import Path

from extproc.batches.files import FileRecord
from extproc.batches.store import SqliteBatchStore


def test_files_are_the_tenants_own_bounded_and_paged(tmp_path: Path) -> None:
    async def go() -> None:
        store = SqliteBatchStore(str(tmp_path / "b.sqlite"))
        for i in range(3):
            assert await store.put_file(FileRecord(f"file-{i}", "acme", "batch", f"{i}.jsonl", 2, 100.0 + i), b"{}", 3)
        assert not await store.put_file(FileRecord("file-9", "acme", "batch", "x", 2, 200.0), b"{}", 3)
        assert await store.put_file(FileRecord("file-o", "other", "batch", "x", 1, 150.0), b"x", 3)
        assert await store.get_file("file-1", "other") is None and await store.file_data("file-1", "other") is None
        assert await store.file_data("file-1", "acme") == b"{}"
        assert not await store.delete_file("file-1", "other")
        page, more = await store.list_files("acme", None, 2, None)
        assert [f.id for f in page] == ["file-2", "file-1"] and more
        page, more = await store.list_files("acme", "batch", 2, "file-1")
        assert [f.id for f in page] == ["file-0"] and not more
        assert await store.delete_file("file-1", "acme") and await store.get_file("file-1", "acme") is None
        await store.close()

    asyncio.run(go())
