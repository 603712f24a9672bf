"""The extproc's gRPC services straight on h2: HTTP/2 by the h2 library, gRPC's few rules here.

The Unix socket Envoy uses for a local extproc carries one short bidirectional stream per request
and four small messages each way. grpclib served it from the loop's own thread (no grpc core thread
trips), but a quarter of the loop's time went to its per-stream machinery around h2's: events,
queues, codecs, tasks (docs/performance.md, "Issue 38, ninth pass"). This server keeps h2 (frames, HPACK, flow control, its state machines) and does only
what gRPC adds over HTTP/2 itself: the 5-byte message prefix, `grpc-status` trailers, deadlines.
A read with a message waiting returns it without a suspension; a write that fits the peer's window
is framed at once and goes out with the others of the same turn of the loop, in one syscall.

The services are the grpc.aio servicers the TCP port serves (`Services`, extproc/grpc_services.py);
each call is its own servicer context (read, write, metadata, abort).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import inspect
import logging
import os
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import H2Error, ProtocolError
from h2.frame_buffer import FrameBuffer
from h2.settings import SettingCodes
from hyperframe.frame import DataFrame, Frame

from adapters.kserve.status import encode_grpc_message, frame
from extproc.grpc_services import Services

log = logging.getLogger("modelyard.socket")

# Envoy sends DATA frames as large as the peer allows, 16 KiB by default: each is an h2 event and a
# buffer append in Python, which a 30 MB image body would pay 1,900 times.
MAX_FRAME = 1 << 20
# Inbound windows, per stream and for the connection (4 MiB, as grpclib had): a large body flows
# without waiting on a window update per 64 KiB.
WINDOW = 4 << 20

_REPLY_HEADERS = ((b":status", b"200"), (b"content-type", b"application/grpc"))
_OK_TRAILERS = ((b"grpc-status", b"0"),)
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


def _metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, Any], ...]:
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


def _timeout(value: bytes) -> float | None:
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None or not value[:-1].isdigit():
        return None
    return int(value[:-1]) * unit


def _no_body_repr() -> str:
    return "<data>"


class _Frames(FrameBuffer):
    """h2's frame reader, minus a cost: h2 reprs every frame it receives for a trace log it writes only
    when asked, and a DATA frame's repr hex-encodes its whole payload (a third of the extproc's time
    on a 30 MB body). Its body is left out of that repr."""

    def __next__(self) -> Frame:
        frame = super().__next__()
        if type(frame) is DataFrame:
            frame._body_repr = _no_body_repr  # type: ignore[method-assign]
        return frame


class _Call:
    """One gRPC call on one HTTP/2 stream, and the servicer context its handler is given."""

    __slots__ = ("_conn", "sid", "_load", "_dump", "_headers", "_head", "_body", "_filled", "_messages",
                 "_waiter", "ended", "reset", "task", "headers_sent", "expired", "_timer")

    def __init__(self, conn: _Connection, sid: int, handler: grpc.RpcMethodHandler,
                 headers: list[tuple[bytes, bytes]]) -> None:
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
    """One HTTP/2 connection (Envoy keeps a few): h2's state, the calls open on it."""

    def __init__(self, server: H2GrpcServer) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.h2 = H2Connection(H2Configuration(
            client_side=False, header_encoding=None,
            validate_inbound_headers=False, normalize_inbound_headers=False,
            validate_outbound_headers=False, normalize_outbound_headers=False))
        self.h2.incoming_buffer = _Frames(server=True)
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self._paused = False
        self._flush_pending = False
        self._writable: list[asyncio.Future[None]] = []  # senders waiting on the peer's window or our buffer

    def connection_made(self, transport: Any) -> None:  # uvloop's is no asyncio.Transport subclass
        self.transport = transport
        self.server.connections.add(self)
        h = self.h2
        h.initiate_connection()
        # Sent right after the preface; h2 applies them once Envoy acknowledges. Streams as grpc.aio
        # allows (h2's 100 would make a busier Envoy's next stream a connection error).
        h.update_settings({SettingCodes.MAX_FRAME_SIZE: MAX_FRAME, SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
                           SettingCodes.MAX_CONCURRENT_STREAMS: (1 << 31) - 1})
        h.increment_flow_control_window(WINDOW - h.local_settings.initial_window_size)
        # Taken now, not at the peer's ACK: h2 sizes a read's frames by the limit it had when the read began,
        # so a large frame in the same read as the ACK would be a connection error.
        h.max_inbound_frame_size = MAX_FRAME
        transport.write(h.data_to_send())

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
        h = self.h2
        try:
            events = h.receive_data(data)
        except ProtocolError as e:  # a peer that does not speak HTTP/2 as it should: tell it, and hang up
            log.warning("HTTP/2 error on the extproc socket, connection closed: %s", e)
            self._flush()  # h2's GOAWAY
            if self.transport is not None:
                self.transport.close()
            return
        for ev in events:
            if isinstance(ev, DataReceived):
                call = self.calls.get(ev.stream_id)
                if call is not None:
                    call.feed(ev.data)
                if ev.flow_controlled_length:
                    with contextlib.suppress(H2Error):  # a stream already closed: the connection's window still counts
                        h.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, RequestReceived):
                self._open(ev.stream_id, ev.headers)
            elif isinstance(ev, StreamEnded):
                call = self.calls.get(ev.stream_id)
                if call is not None:
                    call.end()
            elif isinstance(ev, StreamReset):
                call = self.calls.pop(ev.stream_id, None)
                if call is not None:
                    call.reset = True
                    call.cancel()
                self._wake_writers()
            elif isinstance(ev, WindowUpdated):
                self._wake_writers()
            elif isinstance(ev, ConnectionTerminated):  # the peer's GOAWAY: h2 sends nothing more on this connection
                self._flush()
                self.close()
                return
        self._flush()

    def _open(self, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        path = b""
        timeout = None
        for k, v in headers:
            if k == b":path":
                path = v
            elif k == b"grpc-timeout":
                timeout = _timeout(v)
        server = self.server
        handler = server.handlers.get(path.decode("ascii", "replace"))
        if handler is None:
            self._refuse(sid, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {path.decode('ascii', 'replace')}")
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
        with contextlib.suppress(H2Error):
            self.h2.send_headers(sid, _trailers(code, details, False), end_stream=True)

    async def send(self, call: _Call, data: bytes) -> None:
        h = self.h2
        sid = call.sid
        try:
            if call.reset or self.transport is None:
                raise asyncio.CancelledError()  # the caller is gone: as grpc.aio, the handler is cancelled
            if not call.headers_sent:
                h.send_headers(sid, _REPLY_HEADERS)
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
        except H2Error:  # the stream or the connection closed under it (a peer's error or GOAWAY): as a reset
            raise asyncio.CancelledError() from None

    def finish(self, call: _Call, code: grpc.StatusCode, details: str = "") -> None:
        """The call's trailers (with the reply headers if none went out), unless the stream is gone."""
        call.stop_timer()
        if self.calls.pop(call.sid, None) is None or call.reset or self.transport is None:
            return
        trailers = _OK_TRAILERS if code is grpc.StatusCode.OK and call.headers_sent else \
            _trailers(code, details, call.headers_sent)
        try:
            self.h2.send_headers(call.sid, trailers, end_stream=True)
        except H2Error:  # closed meanwhile (the peer's END_STREAM and RST crossing ours)
            return
        self._flush_soon()

    def stop_sending(self, sid: int) -> None:
        with contextlib.suppress(H2Error):
            self.h2.reset_stream(sid, ErrorCodes.NO_ERROR)
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
        with contextlib.suppress(H2Error):
            self.h2.close_connection(ErrorCodes.NO_ERROR, additional_data=reason.encode() or None)
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
