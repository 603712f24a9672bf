"""The gateway's SSE event log for `/mcp` streams (docs/mcp.md "Streams and resumption").

Every message the gateway sends on an SSE stream is appended here first, under the stream's id and a
sequence number (the event id is `<stream>-<seq>`), in the same kind of store as the sessions:
memory (one process), SQLite (the host's workers and replicas), Redis (replicas anywhere). A client
that lost a stream sends `GET /mcp` with `Last-Event-ID`; whichever extproc gets it replays what
followed that id from here, and follows the stream until it ends.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import orjson

from extproc.mcp.sessions import SessionStoreDown

_SWEEP_S = 30.0
_EVENT_ID = re.compile(r"^([0-9a-f]{32})-([0-9]{1,9})$")


def event_id(stream: str, seq: int) -> str:
    return f"{stream}-{seq}"


def parse_event_id(raw: str | None) -> tuple[str, int] | None:
    """(stream, seq) of an event id the gateway made; None for anything else."""
    m = _EVENT_ID.match(raw.strip()) if raw else None
    return (m.group(1), int(m.group(2))) if m else None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    session: str  # the client session the stream belongs to: only it may resume it
    kind: str  # "call" (a POST's answer: ends with it) | "listen" (the GET stream: open-ended)
    deadline: float  # a call stream not ended by then lost its carrier (a replica that died)
    done: bool
    rid: Any = None  # a call's JSON-RPC id: its error, when the replica carrying it died


class EventStore(Protocol):
    async def open(self, stream: str, session: str, kind: str, deadline: float, rid: Any) -> None: ...
    async def append(self, stream: str, data: bytes, last: bool = False) -> int: ...
    async def end(self, stream: str) -> None: ...
    async def info(self, stream: str) -> StreamInfo | None: ...
    async def after(self, stream: str, seq: int) -> tuple[list[tuple[int, bytes]], bool]: ...
    async def close(self) -> None: ...


class MemoryEvents:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._streams: dict[str, tuple[float, StreamInfo, list[bytes]]] = {}

    def _sweep(self) -> None:
        now = time.time()
        for k in [k for k, v in self._streams.items() if v[0] < now]:
            del self._streams[k]

    async def open(self, stream: str, session: str, kind: str, deadline: float, rid: Any) -> None:
        self._sweep()
        self._streams[stream] = (time.time() + self.ttl_s, StreamInfo(session, kind, deadline, False, rid), [])

    async def append(self, stream: str, data: bytes, last: bool = False) -> int:
        events = self._streams[stream][2]
        events.append(data)
        if last:
            await self.end(stream)
        return len(events)

    async def end(self, stream: str) -> None:
        exp, info, events = self._streams[stream]
        self._streams[stream] = (exp, StreamInfo(info.session, info.kind, info.deadline, True, info.rid), events)

    async def info(self, stream: str) -> StreamInfo | None:
        row = self._streams.get(stream)
        return row[1] if row is not None and row[0] >= time.time() else None

    async def after(self, stream: str, seq: int) -> tuple[list[tuple[int, bytes]], bool]:
        row = self._streams.get(stream)
        if row is None:
            return [], True
        return [(i + 1, d) for i, d in enumerate(row[2]) if i + 1 > seq], row[1].done

    async def close(self) -> None:
        pass


class SqliteEvents:
    """Two tables in the sessions' file; every statement in a worker thread."""

    def __init__(self, path: str, ttl_s: float) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._swept = 0.0

    def _run(self, sql: str, args: tuple[Any, ...], then: tuple[str, tuple[Any, ...]] | None = None) -> list[Any]:
        try:
            with self._lock:
                if self._conn is None:
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                    conn = sqlite3.connect(self.path, check_same_thread=False, timeout=5.0, isolation_level=None)
                    conn.execute("PRAGMA journal_mode=WAL")
                    # A replay buffer, not a ledger: no fsync per event (WAL stays consistent on a crash).
                    conn.execute("PRAGMA synchronous=NORMAL")
                    conn.execute("CREATE TABLE IF NOT EXISTS mcp_streams (stream TEXT PRIMARY KEY, session TEXT, "
                                 "kind TEXT, deadline REAL, done INTEGER, expires REAL, rid BLOB)")
                    conn.execute("CREATE TABLE IF NOT EXISTS mcp_events (stream TEXT, seq INTEGER, data BLOB, "
                                 "PRIMARY KEY (stream, seq))")
                    self._conn = conn
                if then is None:
                    return self._conn.execute(sql, args).fetchall()
                with self._conn:  # one transaction: the last event and the end together
                    self._conn.execute("BEGIN IMMEDIATE")
                    rows = self._conn.execute(sql, args).fetchall()
                    self._conn.execute(*then)
                return rows
        except (sqlite3.Error, OSError) as e:
            raise SessionStoreDown(f"sqlite {self.path}: {e}") from None

    async def open(self, stream: str, session: str, kind: str, deadline: float, rid: Any) -> None:
        now = time.time()
        await asyncio.to_thread(self._run, "INSERT OR REPLACE INTO mcp_streams VALUES (?, ?, ?, ?, 0, ?, ?)",
                                (stream, session, kind, deadline, now + self.ttl_s, orjson.dumps(rid)))
        if now - self._swept > _SWEEP_S:  # expired streams go now and then, not at every open
            self._swept = now
            await asyncio.to_thread(self._run, "DELETE FROM mcp_events WHERE stream IN "
                                    "(SELECT stream FROM mcp_streams WHERE expires < ?)", (now,))
            await asyncio.to_thread(self._run, "DELETE FROM mcp_streams WHERE expires < ?", (now,))

    async def append(self, stream: str, data: bytes, last: bool = False) -> int:
        # One statement: the next number is taken and used atomically, whichever process appends.
        end = ("UPDATE mcp_streams SET done = 1 WHERE stream = ?", (stream,)) if last else None
        rows = await asyncio.to_thread(
            self._run, "INSERT INTO mcp_events SELECT ?, COALESCE(MAX(seq), 0) + 1, ? FROM mcp_events "
            "WHERE stream = ? RETURNING seq", (stream, data, stream), end)
        return int(rows[0][0])

    async def end(self, stream: str) -> None:
        await asyncio.to_thread(self._run, "UPDATE mcp_streams SET done = 1 WHERE stream = ?", (stream,))

    async def info(self, stream: str) -> StreamInfo | None:
        rows = await asyncio.to_thread(self._run, "SELECT session, kind, deadline, done, rid FROM mcp_streams "
                                       "WHERE stream = ? AND expires > ?", (stream, time.time()))
        if not rows:
            return None
        return StreamInfo(rows[0][0], rows[0][1], rows[0][2], bool(rows[0][3]), orjson.loads(rows[0][4]))

    async def after(self, stream: str, seq: int) -> tuple[list[tuple[int, bytes]], bool]:
        # "done" first: read after the events, an end could hide events appended between the reads.
        done = await asyncio.to_thread(self._run, "SELECT done FROM mcp_streams WHERE stream = ?", (stream,))
        rows = await asyncio.to_thread(self._run, "SELECT seq, data FROM mcp_events WHERE stream = ? AND seq > ? "
                                       "ORDER BY seq", (stream, seq))
        return [(int(s), bytes(d)) for s, d in rows], (not done) or bool(done[0][0])

    async def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class RedisEvents:
    """A list per stream and a hash of its facts, both expiring with the stream."""

    def __init__(self, url: str, ttl_s: float) -> None:
        import redis.asyncio as redis
        from redis.exceptions import RedisError

        self.ttl_s = max(1, int(ttl_s))
        self._errors = RedisError
        self._redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)

    async def _do(self, *commands: tuple[Any, ...]) -> list[Any]:
        try:
            async with self._redis.pipeline(transaction=True) as p:
                for c in commands:
                    p.execute_command(*c)
                return list(await p.execute())
        except (self._errors, OSError) as e:
            raise SessionStoreDown(f"redis: {type(e).__name__}") from None

    async def open(self, stream: str, session: str, kind: str, deadline: float, rid: Any) -> None:
        k = f"modelyard:mcp:stream:{stream}"
        await self._do(("HSET", k, "session", session, "kind", kind, "deadline", repr(deadline), "done", "0",
                        "rid", orjson.dumps(rid)),
                       ("EXPIRE", k, self.ttl_s))

    async def append(self, stream: str, data: bytes, last: bool = False) -> int:
        k = f"modelyard:mcp:events:{stream}"
        end = (("HSET", f"modelyard:mcp:stream:{stream}", "done", "1"),) if last else ()
        got = await self._do(("RPUSH", k, data), ("EXPIRE", k, self.ttl_s), *end)
        return int(got[0])

    async def end(self, stream: str) -> None:
        await self._do(("HSET", f"modelyard:mcp:stream:{stream}", "done", "1"))

    async def info(self, stream: str) -> StreamInfo | None:
        got = (await self._do(("HGETALL", f"modelyard:mcp:stream:{stream}")))[0]
        if not got:
            return None
        d = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
             for k, v in got.items()}
        return StreamInfo(d["session"], d["kind"], float(d["deadline"]), d["done"] == "1", orjson.loads(d["rid"]))

    async def after(self, stream: str, seq: int) -> tuple[list[tuple[int, bytes]], bool]:
        # One transaction: the end flag and the events it covers are read together.
        done, rows = await self._do(("HGET", f"modelyard:mcp:stream:{stream}", "done"),
                                    ("LRANGE", f"modelyard:mcp:events:{stream}", seq, -1))
        return [(seq + 1 + i, bytes(d)) for i, d in enumerate(rows)], done in (None, b"1", "1")

    async def close(self) -> None:
        await self._redis.aclose()
