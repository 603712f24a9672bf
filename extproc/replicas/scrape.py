"""One kept-open HTTP/1.1 connection per replica's /metrics: a GET, its body, nothing more.

The board polls every replica every 50 ms or so on the event loop that serves the calls; aiohttp's
client (session, request and response objects, timers, header multidicts) cost several times the
small exposition it fetches. This reads just what a scrape needs: the status, `content-length` or
chunked bodies, and whether the server keeps the connection. Plain HTTP only, as the board's URLs.
"""

from __future__ import annotations

import asyncio
from typing import cast

from extproc.replicas.exposition import MetricsParseError

_HEAD_LIMIT = 64 * 1024  # a response head longer than this is not a metrics endpoint's
_BODY_LIMIT = 64 * 1024 * 1024


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def more(self) -> None:
        """Wait for bytes past those in `buf` (raises once the peer closed)."""
        if self.closed:
            raise ConnectionResetError("metrics connection closed mid-response")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


class MetricsScrape:
    """GETs one URL (`host`, `port`, `path`) over a connection it keeps between polls. Not for
    concurrent use: the board polls each endpoint from one task, one poll at a time."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self._request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/plain\r\n"
                         "User-Agent: modelyard-replica-board\r\n\r\n").encode("latin-1")
        self._conn: _Conn | None = None

    async def get(self) -> tuple[int, bytes]:
        """(status, body). Any failure closes the connection (the next poll opens another), so a
        response read halfway never runs into the next one."""
        try:
            return await self._get()
        except BaseException:
            self.close()
            raise

    async def _get(self) -> tuple[int, bytes]:
        conn = self._conn
        if conn is None or conn.closed or conn.transport is None or conn.transport.is_closing():
            self.close()
            _, conn = await asyncio.get_running_loop().create_connection(_Conn, self.host, self.port)
            self._conn = conn
        assert conn.transport is not None
        conn.buf.clear()
        conn.transport.write(self._request)
        buf = conn.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > _HEAD_LIMIT:
                raise MetricsParseError("metrics response head too long")
            await conn.more()
        head = bytes(buf[:end]).decode("latin-1").split("\r\n")
        del buf[:end + 4]
        status, keep = _status(head[0])
        length: int | None = None
        chunked = False
        for line in head[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = _int(value, "content-length")
            elif name == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif name == "connection":
                v = value.strip().lower()
                keep = v != "close" and (keep or v == "keep-alive")
        if chunked:
            body = await _chunked(conn)
        elif length is not None:
            if length > _BODY_LIMIT:
                raise MetricsParseError(f"metrics body of {length} bytes")
            while len(buf) < length:
                await conn.more()
            body = bytes(buf[:length])
            del buf[:length]
        else:  # no length: the body runs to the connection's end
            keep = False
            while not conn.closed:
                if len(buf) > _BODY_LIMIT:
                    raise MetricsParseError("metrics body too long")
                await conn.more()
            body = bytes(buf)
        if not keep:
            self.close()
        return status, body

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.transport.close()


def _status(line: str) -> tuple[int, bool]:
    """The status and whether the version keeps the connection by default (1.1 yes, 1.0 no)."""
    version, _, rest = line.partition(" ")
    if not version.startswith("HTTP/1."):
        raise MetricsParseError(f"not an HTTP/1.x response: {line[:40]!r}")
    return _int(rest[:3], "status"), version != "HTTP/1.0"


def _int(value: str, what: str) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise MetricsParseError(f"metrics response: bad {what} {value.strip()[:20]!r}") from None
    if n < 0:
        raise MetricsParseError(f"metrics response: bad {what} {n}")
    return n


async def _chunked(conn: _Conn) -> bytes:
    buf, out = conn.buf, bytearray()
    while True:
        while (eol := buf.find(b"\r\n")) < 0:
            await conn.more()
        size = _hex(bytes(buf[:eol]).split(b";", 1)[0])
        del buf[:eol + 2]
        if size == 0:  # trailers, then the blank line
            while (end := buf.find(b"\r\n")) != 0:
                if end > 0:
                    del buf[:end + 2]
                    continue
                await conn.more()
            del buf[:2]
            return bytes(out)
        if len(out) + size > _BODY_LIMIT:
            raise MetricsParseError("metrics body too long")
        while len(buf) < size + 2:
            await conn.more()
        out += buf[:size]
        del buf[:size + 2]


def _hex(token: bytes) -> int:
    try:
        return int(token.strip(), 16)
    except ValueError:
        raise MetricsParseError(f"metrics response: bad chunk size {token[:20]!r}") from None
