"""A client's MCP session: whose it is and its upstream session per server, kept where every
extproc that may get its next request can read it: memory (one process), SQLite (the host's
workers and replicas), Redis (replicas anywhere)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson


@dataclass(slots=True)
class McpSession:
    id: str
    tenant: str
    key: str  # the caller's key digest: another key of the tenant may not ride this session
    protocol_version: str
    # server -> (its session id, "" for a stateless server; the protocol version it agreed)
    upstream: dict[str, tuple[str, str]] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    def dumps(self) -> bytes:
        return orjson.dumps({"tenant": self.tenant, "key": self.key, "v": self.protocol_version,
                             "up": self.upstream, "created": self.created})

    @classmethod
    def loads(cls, sid: str, raw: bytes | str) -> McpSession:
        d = orjson.loads(raw)
        return cls(sid, d["tenant"], d["key"], d["v"], {k: (v[0], v[1]) for k, v in d["up"].items()}, d["created"])


class SessionStoreDown(Exception):
    """The session map cannot be read or written now (a disk, a Redis): the call is answered 503."""


class SessionStore(Protocol):
    async def get(self, sid: str) -> McpSession | None: ...
    async def put(self, s: McpSession) -> None: ...
    async def delete(self, sid: str) -> None: ...
    async def close(self) -> None: ...


class MemorySessions:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._rows: dict[str, tuple[float, bytes]] = {}

    async def get(self, sid: str) -> McpSession | None:
        row = self._rows.get(sid)
        if row is None or row[0] < time.time():
            return None
        return McpSession.loads(sid, row[1])

    async def put(self, s: McpSession) -> None:
        self._rows[s.id] = (time.time() + self.ttl_s, s.dumps())

    async def delete(self, sid: str) -> None:
        self._rows.pop(sid, None)

    async def close(self) -> None:
        pass


class SqliteSessions:
    """One table in a file every worker on the host opens; reads and writes in a thread."""

    def __init__(self, path: str, ttl_s: float) -> None:
        self.path = path
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None  # opened at first use, in a worker thread

    def _run(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        try:
            return self._execute(sql, args)
        except (sqlite3.Error, OSError) as e:
            raise SessionStoreDown(f"sqlite {self.path}: {e}") from None

    def _execute(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        with self._lock:
            if self._conn is None:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                conn = sqlite3.connect(self.path, check_same_thread=False, timeout=5.0, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("CREATE TABLE IF NOT EXISTS mcp_sessions (id TEXT PRIMARY KEY, expires REAL NOT NULL, "
                             "doc BLOB NOT NULL)")
                self._conn = conn
            return self._conn.execute(sql, args).fetchall()

    async def get(self, sid: str) -> McpSession | None:
        rows = await asyncio.to_thread(self._run, "SELECT doc FROM mcp_sessions WHERE id = ? AND expires > ?",
                                       (sid, time.time()))
        return McpSession.loads(sid, rows[0][0]) if rows else None

    async def put(self, s: McpSession) -> None:
        await asyncio.to_thread(self._run, "INSERT OR REPLACE INTO mcp_sessions VALUES (?, ?, ?)",
                                (s.id, time.time() + self.ttl_s, s.dumps()))

    async def delete(self, sid: str) -> None:
        await asyncio.to_thread(self._run, "DELETE FROM mcp_sessions WHERE id = ? OR expires < ?", (sid, time.time()))

    async def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class RedisSessions:
    def __init__(self, url: str, ttl_s: float) -> None:
        import redis.asyncio as redis
        from redis.exceptions import RedisError

        self.ttl_ms = int(ttl_s * 1000)
        self._errors = RedisError
        self._redis = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)

    async def get(self, sid: str) -> McpSession | None:
        try:
            raw = await self._redis.get(f"modelyard:mcp:{sid}")
        except (self._errors, OSError) as e:
            raise SessionStoreDown(f"redis: {type(e).__name__}") from None
        return McpSession.loads(sid, raw) if raw else None

    async def put(self, s: McpSession) -> None:
        try:
            await self._redis.set(f"modelyard:mcp:{s.id}", s.dumps(), px=self.ttl_ms)
        except (self._errors, OSError) as e:
            raise SessionStoreDown(f"redis: {type(e).__name__}") from None

    async def delete(self, sid: str) -> None:
        try:
            await self._redis.delete(f"modelyard:mcp:{sid}")
        except (self._errors, OSError) as e:
            raise SessionStoreDown(f"redis: {type(e).__name__}") from None

    async def close(self) -> None:
        await self._redis.aclose()
