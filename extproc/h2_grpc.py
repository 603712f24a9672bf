"""The extproc's gRPC services on its own HTTP/2 (extproc/http2.py), gRPC's few rules here.

The Unix socket Envoy uses for a local extproc carries one short bidirectional stream per request
and four small messages each way. grpclib served it from the loop's own thread (no grpc core thread
trips), but a quarter of the loop's time went to its per-stream machinery around h2's: events,
queues, codecs, tasks (docs/performance.md, "Issue 38, ninth pass"); then h2's own state machines were
a fifth of it (the twelfth pass), and extproc/http2.py took its place. This server does only what gRPC
adds over HTTP/2 itself: the 5-byte message prefix, `grpc-status` trailers, deadlines.
A read with a message waiting returns it without a suspension; a write that fits the peer's window
is framed at once and goes out with the others of the same turn of the loop, in one syscall.

The services are the grpc.aio servicers the TCP port serves (`Services`, extproc/grpc_services.py);
each call is its own servicer context (read, write, metadata, abort).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import inspect
import logging
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from adapters.kserve.status import encode_grpc_message, frame
from extproc import http2
from extproc.grpc_services import Services
from extproc.http2 import Http2Error, ProtocolError

log = logging.getLogger("modelyard.socket")

# Envoy sends DATA frames as large as the peer allows, 16 KiB by default: each is an event and a
# buffer append in Python, which a 30 MB image body would pay 1,900 times.
MAX_FRAME = 1 << 20
# Inbound windows, per stream and for the connection (4 MiB, as grpclib had): a large body flows
# without waiting on a window update per 64 KiB.
WINDOW = 4 << 20

_REPLY_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
# Every call sends these two blocks: coded once (they use no dynamic table, so any connection takes them).
_REPLY_BLOCK = http2.encode_headers(_REPLY_HEADERS)
_OK_BLOCK = http2.encode_headers(((b"grpc-status", b"0"),))
_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class _Abort(Exception):
    """A call ended with a status of the servicer's choosing (`context.abort`) or of ours."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _trailers(code: grpc.StatusCode, details: str, headers_sent: bool) -> list[tuple[bytes, bytes]]:
    out = [] if headers_sent else list(_REPLY_HEADERS)
    out.append((b"grpc-status", str(code.value[0]).encode()))
    if details:
        out.append((b"grpc-message", encode_grpc_message(details).encode()))
    return out


Headers = tuple[tuple[bytes, bytes], ...]


# Envoy sends one header block for all its streams, which extproc/http2.py hands back as one tuple.
@functools.lru_cache(maxsize=64)
def _metadata(headers: Headers) -> tuple[tuple[str, Any], ...]:
    """The caller's metadata as grpc.aio gives it: str keys, str values, `-bin` values decoded."""
    out: list[tuple[str, Any]] = []
    for k, v in headers:
        if k[:1] == b":" or k in (b"te", b"content-type", b"grpc-timeout", b"grpc-encoding",
                                  b"grpc-accept-encoding", b"user-agent"):
            continue
        key = k.decode("ascii", "replace")
        if key.endswith("-bin"):
            with contextlib.suppress(ValueError):
                out.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
            continue
        out.append((key, v.decode("ascii", "replace")))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _target(headers: Headers) -> tuple[str, float | None]:
    """The method a call's headers ask for, and its deadline in seconds (none without `grpc-timeout`)."""
    path = b""
    timeout = None
    for k, v in headers:
        if k == b":path":
            path = v
        elif k == b"grpc-timeout":
            timeout = _timeout(v)
    return path.decode("ascii", "replace"), timeout


def _timeout(value: bytes) -> float | None:
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * unit


class _Call:
    """One gRPC call on one HTTP/2 stream, and the servicer context its handler is given."""

    __slots__ = ("_conn", "sid", "_load", "_dump", "_headers", "_head", "_body", "_filled", "_messages",
                 "_waiter", "ended", "reset", "task", "headers_sent", "expired", "_timer")

    def __init__(self, conn: _Connection, sid: int, handler: grpc.RpcMethodHandler,
                 headers: Headers) -> None:
        self._conn = conn
        self.sid = sid
        self._load: Callable[[Any], Any] | None = handler.request_deserializer  # bytes or a bytearray
        self._dump: Callable[[Any], bytes] | None = handler.response_serializer
        self._headers = headers
        self._head = bytearray()  # the 5-byte prefix of a message that spans frames
        self._body: bytearray | None = None  # that message, filled as its frames come
        self._filled = 0
        self._messages: deque[bytes | bytearray] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.ended = False  # the caller's half is closed
        self.reset = False  # the caller reset the stream: nothing more goes out on it
        self.task: asyncio.Task[None] | None = None
        self.headers_sent = False
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None

    # The servicer context (what extproc's servicers use of grpc.aio's).

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return _metadata(self._headers)

    async def read(self) -> Any:
        while not self._messages:
            if self.ended:
                return grpc.aio.EOF
            self._waiter = self._conn.loop.create_future()
            await self._waiter
        payload = self._messages.popleft()
        if self._load is None:
            return bytes(payload)
        try:
            return self._load(payload)
        except Exception:
            raise _Abort(grpc.StatusCode.INTERNAL, "could not parse the request message") from None

    async def write(self, message: Any) -> None:
        await self._conn.send(self, frame(self._dump(message) if self._dump is not None else message))

    def waiting(self) -> bool:
        """Whether another message has come and waits to be read (a reader may gather before it answers)."""
        return bool(self._messages)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[Any] = ()) -> None:
        raise _Abort(code, details)

    # What the connection tells it.

    def feed(self, data: bytes) -> None:
        if (self._body is None and not self._head and len(data) >= 5 and not data[0]
                and len(data) == 5 + int.from_bytes(data[1:5], "big")):
            self._messages.append(data[5:])  # one whole message in one frame: the common case
            self._wake()
            return
        view = memoryview(data)
        while view:
            if self._body is None:  # a message's prefix, perhaps split across frames
                take = 5 - len(self._head)
                self._head += view[:take]
                view = view[take:]
                if len(self._head) < 5:
                    break
                if self._head[0]:
                    self._fail(grpc.StatusCode.UNIMPLEMENTED, "compressed messages are not accepted")
                    return
                n = int.from_bytes(self._head[1:5], "big")
                if n > self._conn.server.max_message:
                    self._fail(grpc.StatusCode.RESOURCE_EXHAUSTED, f"message of {n} bytes is over the limit")
                    return
                self._body, self._filled = bytearray(n), 0  # each byte copied once, into its place
            body = self._body
            take = min(len(body) - self._filled, len(view))
            body[self._filled:self._filled + take] = view[:take]
            self._filled += take
            view = view[take:]
            if self._filled == len(body):
                self._messages.append(body)
                self._body = None
                self._head.clear()
        self._wake()

    def end(self) -> None:
        self.ended = True
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def _fail(self, code: grpc.StatusCode, details: str) -> None:
        self._messages.clear()
        self._body = None
        self.ended = True
        self._conn.finish(self, code, details)
        self._conn.stop_sending(self.sid)  # what is left of the request is not wanted
        self.cancel()

    def cancel(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def expire(self) -> None:
        self.expired = True
        self.cancel()

    def start_timer(self, seconds: float) -> None:
        self._timer = self._conn.loop.call_later(seconds, self.expire)

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


async def _requests(call: _Call) -> AsyncIterator[Any]:
    while (got := await call.read()) is not grpc.aio.EOF:
        yield got


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection (Envoy keeps a few): its HTTP/2 state, the calls open on it."""

    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        # Streams as grpc.aio allows (a limit would make a busier Envoy's next stream a connection error).
        self.h2 = http2.Http2Server(max_frame=MAX_FRAME, window=WINDOW)
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._flush_pending = False
        self._writable: list[asyncio.Future[None]] = []  # senders waiting on the peer's window or our buffer

    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport subclass
        self.transport = transport
        self.server.connections.add(self)
        transport.write(self.h2.data_to_send())  # the server's SETTINGS and its connection window

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        for call in list(self.calls.values()):
            call.reset = True
            call.cancel()
        self._wake_writers()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_writers()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive(data)
        except ProtocolError as e:  # a peer that does not speak HTTP/2 as it should: tell it, and hang up
            log.warning("HTTP/2 error on the extproc socket, connection closed: %s", e)
            self._flush()  # the GOAWAY
            if self.transport is not None:
                self.transport.close()
            return
        calls = self.calls
        for ev in events:
            kind = ev[0]
            if kind == http2.DATA_RECEIVED:
                call = calls.get(ev[1])
                if call is not None:
                    call.feed(ev[2])
            elif kind == http2.REQUEST:
                self._open(ev[1], ev[2])
            elif kind == http2.ENDED:
                call = calls.get(ev[1])
                if call is not None:
                    call.end()
            elif kind == http2.RESET:
                call = calls.pop(ev[1], None)
                if call is not None:
                    call.reset = True
                    call.cancel()
                self._wake_writers()
            elif kind == http2.WINDOW_OPENED:
                self._wake_writers()
            elif kind == http2.GOAWAY_RECEIVED:  # the peer's GOAWAY: nothing more goes out on this connection
                self._flush()
                self.close()
                return
        self._flush()

    def _open(self, sid: int, headers: Headers) -> None:
        path, timeout = _target(headers)
        server = self.server
        handler = server.handlers.get(path)
        if handler is None:
            self._refuse(sid, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path}")
            return
        if server.draining:
            self._refuse(sid, grpc.StatusCode.UNAVAILABLE, "the extproc is draining")
            return
        call = _Call(self, sid, handler, headers)
        self.calls[sid] = call
        if timeout is not None:
            call.start_timer(timeout)
        call.task = self.loop.create_task(server.serve(call, handler))

    def _refuse(self, sid: int, code: grpc.StatusCode, details: str) -> None:
        with contextlib.suppress(Http2Error):
            self.h2.send_headers(sid, _trailers(code, details, False), end_stream=True)

    async def send(self, call: _Call, data: bytes) -> None:
        h = self.h2
        sid = call.sid
        try:
            if call.reset or self.transport is None:
                raise asyncio.CancelledError()  # the caller is gone: as grpc.aio, the handler is cancelled
            if not call.headers_sent:
                h.send_block(sid, _REPLY_BLOCK)
                call.headers_sent = True
            if not self._paused and len(data) <= min(h.local_flow_control_window(sid), h.max_outbound_frame_size):
                h.send_data(sid, data)
                self._flush_soon()
                return
            view = memoryview(data)
            while view:
                if call.reset or self.transport is None:
                    raise asyncio.CancelledError()
                room = min(h.local_flow_control_window(sid), h.max_outbound_frame_size)
                if room <= 0 or self._paused:
                    self._flush()
                    waiter = self.loop.create_future()
                    self._writable.append(waiter)
                    await waiter
                    continue
                h.send_data(sid, view[:room].tobytes())
                view = view[room:]
            self._flush()
        except Http2Error:  # the stream or the connection closed under it (a peer's error or GOAWAY): as a reset
            raise asyncio.CancelledError() from None

    def finish(self, call: _Call, code: grpc.StatusCode, details: str = "") -> None:
        """The call's trailers (with the reply headers if none went out), unless the stream is gone."""
        call.stop_timer()
        if self.calls.pop(call.sid, None) is None or call.reset or self.transport is None:
            return
        try:
            if code is grpc.StatusCode.OK and call.headers_sent:
                self.h2.send_block(call.sid, _OK_BLOCK, end_stream=True)
            else:
                self.h2.send_headers(call.sid, _trailers(code, details, call.headers_sent), end_stream=True)
        except Http2Error:  # closed meanwhile (the peer's END_STREAM and RST crossing ours)
            return
        self._flush_soon()

    def stop_sending(self, sid: int) -> None:
        with contextlib.suppress(Http2Error):
            self.h2.reset_stream(sid, http2.NO_ERROR)
        self._flush()

    def _flush_soon(self) -> None:
        # One write for what every call answered in this turn of the loop: under load several replies
        # share a syscall, on Envoy's side a read (the floor: 0.92x the CPU per call, 0.88x with work).
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        self._flush()

    def _flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)

    def _wake_writers(self) -> None:
        waiting, self._writable = self._writable, []
        for w in waiting:
            if not w.done():
                w.set_result(None)

    def close(self, reason: str = "") -> None:
        if self.transport is None:
            return
        self.h2.close(http2.NO_ERROR, reason.encode())
        self._flush()
        self.transport.close()


class H2GrpcServer:
    """`services`' handlers on a Unix socket; `stop` refuses new calls and lets open ones finish."""

    def __init__(self, services: Services, path: str, max_message: int = 4 << 20) -> None:
        self.path = path
        self.max_message = max_message
        self._services = services  # read at start: servicers may still be added until then
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        self.connections: set[_Connection] = set()
        self.draining = False
        self._sock: socket.socket | None = None
        self._listener: asyncio.AbstractServer | None = None
        self._inode = 0

    async def serve(self, call: _Call, h: grpc.RpcMethodHandler) -> None:
        code, details = grpc.StatusCode.OK, ""
        behaviour: Any = None
        try:
            if h.request_streaming:
                request: Any = _requests(call)
                behaviour = h.stream_stream if h.response_streaming else h.stream_unary
            else:
                request = await call.read()
                if request is grpc.aio.EOF:
                    raise _Abort(grpc.StatusCode.INTERNAL, "no request message")
                behaviour = h.unary_stream if h.response_streaming else h.unary_unary
            result = behaviour(request, call)
            if inspect.isasyncgen(result):
                async for reply in result:
                    await call.write(reply)
            else:
                reply = await result if inspect.isawaitable(result) else result
                if not h.response_streaming:
                    if reply is None:
                        raise _Abort(grpc.StatusCode.INTERNAL, "no reply")
                    await call.write(reply)
        except _Abort as e:
            code, details = e.code, e.details
        except asyncio.CancelledError:
            if call.expired:
                code, details = grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
            elif self.draining:
                code, details = grpc.StatusCode.UNAVAILABLE, "the extproc stopped"
            else:
                code = grpc.StatusCode.CANCELLED
        except Exception:
            log.exception("gRPC handler %s failed", getattr(behaviour, "__qualname__", "?"))
            code, details = grpc.StatusCode.UNKNOWN, "Unexpected error"
        finally:
            call._conn.finish(call, code, details)

    def bind(self) -> None:
        """Listen on the path now (connections wait in the kernel's queue until `start`)."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket left by a killed process
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.path)
            sock.listen(1024)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        self._sock = sock
        self._inode = os.stat(self.path).st_ino

    async def start(self) -> None:
        self.handlers = dict(self._services.handlers)
        if self._sock is None:
            self.bind()
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_unix_server(lambda: _Connection(self), sock=self._sock)

    async def stop(self, grace: float) -> None:
        """Like grpc.aio's: no new calls, the open ones get `grace` seconds, then are cancelled."""
        self.draining = True
        if self._listener is None:  # never started
            if self._sock is not None:
                self._sock.close()
                self._unlink()
            return
        self._listener.close()  # no new connections
        if open_calls := self._open_tasks():
            await asyncio.wait(open_calls, timeout=grace)
        for task in self._open_tasks():
            task.cancel()
        if open_calls := self._open_tasks():
            await asyncio.wait(open_calls, timeout=1.0)
        for conn in list(self.connections):  # as grpc.aio does: their callers see the channel go
            conn.close("server stopped")
        self._unlink()

    def _open_tasks(self) -> set[asyncio.Task[None]]:
        return {c.task for conn in self.connections for c in conn.calls.values() if c.task is not None and not c.task.done()}

    def _unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:  # not a successor's socket, bound while this one drained
                os.unlink(self.path)
