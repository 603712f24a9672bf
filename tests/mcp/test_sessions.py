"""The session map: two stores on one SQLite file (two processes of one host) see each other's
sessions, their deletions and expiry; memory alone is one process's."""

from __future__ import annotations

from pathlib import Path

import pytest

from extproc.mcp.sessions import McpSession, MemorySessions, SessionStoreDown, SqliteSessions


async def test_two_sqlite_stores_share_one_file(tmp_path: Path) -> None:
    a, b = SqliteSessions(str(tmp_path / "s.sqlite"), 60), SqliteSessions(str(tmp_path / "s.sqlite"), 60)
    s = McpSession("abc", "demo", "k" * 64, "2025-06-18", {"notes": ("up-1", "2025-06-18"), "files": ("", "2025-03-26")})
    await a.put(s)
    got = await b.get("abc")
    assert got == s
    await b.delete("abc")
    assert await a.get("abc") is None
    await a.close()
    await b.close()


async def test_expired_sessions_are_gone(tmp_path: Path) -> None:
    store = SqliteSessions(str(tmp_path / "s.sqlite"), -1)  # expired as soon as written
    await store.put(McpSession("x", "demo", "", "2025-06-18"))
    assert await store.get("x") is None
    await store.close()
    mem = MemorySessions(-1)
    await mem.put(McpSession("x", "demo", "", "2025-06-18"))
    assert await mem.get("x") is None


async def test_a_store_that_cannot_open_says_so(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    store = SqliteSessions(str(tmp_path / "file" / "s.sqlite"), 60)  # under a file: no directory there
    with pytest.raises(SessionStoreDown, match="sqlite"):
        await store.get("x")
