"""The SSE event log behind `Last-Event-ID`: every backend numbers a stream's events 1, 2, ... across
the processes that append (two stores on one SQLite file, two clients of one Redis), replays what
follows an id, and says when the stream ended; event ids of anything else are refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from extproc.mcp.events import EventStore, MemoryEvents, RedisEvents, SqliteEvents, event_id, parse_event_id
from tests.ratelimit.redis_server import RedisServer

STREAM = "ab" * 16


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    srv = RedisServer()
    srv.start()
    try:
        yield srv.url
    finally:
        srv.stop()


@pytest.fixture(params=["memory", "sqlite", "redis"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[EventStore, EventStore]]:
    """Two stores that must see one log (one and the same for memory, which is one process's)."""
    if request.param == "memory":
        m = MemoryEvents(60)
        yield m, m
        return
    stores: tuple[EventStore, EventStore]
    if request.param == "sqlite":
        stores = (SqliteEvents(str(tmp_path / "e.sqlite"), 60), SqliteEvents(str(tmp_path / "e.sqlite"), 60))
    else:
        url = request.getfixturevalue("redis_url")
        stores = (RedisEvents(url, 60), RedisEvents(url, 60))
    yield stores
    for s in stores:
        await s.close()


async def test_one_log_numbered_across_stores_replayed_after_an_id(pair: tuple[EventStore, EventStore]) -> None:
    a, b = pair
    await a.open(STREAM, "session-1", "call", 123.5, {"id": 7})
    seqs = await asyncio.gather(*(s.append(STREAM, f"m{i}".encode()) for i, s in enumerate([a, b, a, b, a])))
    assert sorted(seqs) == [1, 2, 3, 4, 5]  # concurrent appends from two stores: no number twice
    rows, done = await b.after(STREAM, 2)
    assert [s for s, _ in rows] == [3, 4, 5] and not done
    assert {d for _, d in rows} | {d for _, d in (await a.after(STREAM, 0))[0][:2]} == {b"m0", b"m1", b"m2", b"m3", b"m4"}
    await a.end(STREAM)
    rows, done = await b.after(STREAM, 5)
    assert rows == [] and done
    info = await b.info(STREAM)
    assert info is not None and (info.session, info.kind, info.deadline, info.done, info.rid) == (
        "session-1", "call", 123.5, True, {"id": 7})
    assert await b.info("cd" * 16) is None
    other = "ef" * 16  # the last event and the end in one write
    await b.open(other, "session-1", "call", 0.0, None)
    assert await b.append(other, b"answer", last=True) == 1
    assert await a.after(other, 0) == ([(1, b"answer")], True)


def test_event_ids() -> None:
    assert parse_event_id(event_id(STREAM, 12)) == (STREAM, 12)
    for bad in (None, "", "12", f"{STREAM}-", f"{STREAM}-x", f"{STREAM[:-1]}-1", f"{STREAM}-1-2", "../x-1"):
        assert parse_event_id(bad) is None, bad
