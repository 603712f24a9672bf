"""The extproc's gRPC services on grpclib: HTTP/2 parsed on the event loop's own thread.

grpc.aio hands every message between grpc core's poller and event-engine threads and the loop (a
socketpair byte and a wake-up each); at one connection those hand-offs are most of a call's time
(docs/performance.md, "Issue 38, eighth pass"). grpclib has no threads of its own. Envoy's local way
in (`extproc.unix_socket`) is served here; TCP stays on grpc.aio for probes, the CLI and remote peers.

The services stay grpc.aio servicers, written once: `Services` records each method handler as it is
added to the grpc.aio server, and `GrpclibServer` serves the same handlers, each with `_Context`, the
part of grpc.aio's servicer context they use (read, write, metadata, abort).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import weakref
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
from grpclib.const import Cardinality, Handler, Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.server import Handler as _Calls
from grpclib.server import Server, Stream
from h2.settings import SettingCodes


class _Wire:
    """A method's own (de)serializers, as grpc.aio would call them (None: raw bytes)."""

    __slots__ = ("load", "dump")

    def __init__(self, load: Any, dump: Any) -> None:
        self.load = load
        self.dump = dump


class _Codec(CodecBase):
    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        return message_type.dump(message) if message_type.dump is not None else message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return message_type.load(data) if message_type.load is not None else data


class _Context:
    """What the servicers use of `grpc.aio.ServicerContext`, over a grpclib stream."""

    __slots__ = ("_stream",)

    def __init__(self, stream: Stream) -> None:
        self._stream = stream

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        meta = self._stream.metadata
        return tuple(meta.items()) if meta else ()

    async def read(self) -> Any:
        got = await self._stream.recv_message()
        return grpc.aio.EOF if got is None else got

    async def write(self, message: Any) -> None:
        await self._stream.send_message(message)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[Any] = ()) -> None:
        raise GRPCError(Status(code.value[0]), details or None)


async def _requests(stream: Stream) -> AsyncIterator[Any]:
    while (got := await stream.recv_message()) is not None:
        yield got


class Services:
    """Stands in for the grpc.aio server while servicers are added: passes each on, keeps its handlers."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self.server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        handlers = tuple(handlers)
        for h in handlers:
            methods = getattr(h, "_method_handlers", None)  # grpc.method_handlers_generic_handler's table
            if not isinstance(methods, dict):
                raise TypeError(f"{type(h).__name__}: only method_handlers_generic_handler tables are served")
            self.handlers.update(methods)
        self.server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.server.add_registered_method_handlers(service, handlers)  # the generic table above has them too


class GrpclibServer:
    """`services`' handlers on a Unix socket; `stop` refuses new calls and lets open ones finish."""

    def __init__(self, services: Services, path: str) -> None:
        self.path = path
        self._services = services  # read at start: servicers may still be added until then
        self._server: _Server | None = None
        self._open: set[asyncio.Task[Any]] = set()
        self._draining = False
        self._inode = 0
        # Envoy resets each ext_proc stream once its request is done (before our end of it closes):
        # grpclib tells every one at INFO, a log line per request; its warnings and errors stay.
        logging.getLogger("grpclib.server").setLevel(logging.WARNING)

    def _handler(self, h: grpc.RpcMethodHandler) -> Handler:
        wire = _Wire(h.request_deserializer, h.response_serializer)
        if h.request_streaming and h.response_streaming:
            behaviour, cardinality = h.stream_stream, Cardinality.STREAM_STREAM
        elif h.request_streaming:
            behaviour, cardinality = h.stream_unary, Cardinality.STREAM_UNARY
        elif h.response_streaming:
            behaviour, cardinality = h.unary_stream, Cardinality.UNARY_STREAM
        else:
            behaviour, cardinality = h.unary_unary, Cardinality.UNARY_UNARY

        async def call(stream: Stream) -> None:
            if self._draining:
                raise GRPCError(Status.UNAVAILABLE, "draining")
            task = asyncio.current_task()
            assert task is not None
            self._open.add(task)
            try:
                await self._run(behaviour, h.request_streaming, h.response_streaming, stream)
            finally:
                self._open.discard(task)

        return Handler(call, cardinality, wire, wire)

    @staticmethod
    async def _run(behaviour: Any, request_streaming: bool, response_streaming: bool, stream: Stream) -> None:
        context = _Context(stream)
        request = _requests(stream) if request_streaming else await stream.recv_message()
        result = behaviour(request, context)
        if inspect.isasyncgen(result):
            async for reply in result:
                await stream.send_message(reply)
            return
        reply = await result if inspect.isawaitable(result) else result
        if not response_streaming:
            if reply is None:
                raise GRPCError(Status.INTERNAL, "no reply")
            await stream.send_message(reply)

    async def start(self) -> None:
        mapping = {name: self._handler(h) for name, h in self._services.handlers.items()}
        self._server = _Server([_Mapping(mapping)], codec=_Codec())
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # a socket left by a killed process
        await self._server.start(path=self.path)
        self._inode = os.stat(self.path).st_ino

    async def stop(self, grace: float) -> None:
        """Like grpc.aio's: no new calls, the open ones get `grace` seconds, then are cancelled."""
        self._draining = True
        if self._server is None:  # never started
            return
        listener = self._server._server  # grpclib's asyncio server: stop accepting connections first
        if listener is not None:
            listener.close()
        if self._open:
            await asyncio.wait(set(self._open), timeout=grace)
        self._server.close()  # cancels the calls still open
        await self._server.wait_closed()
        for conn in list(self._server.connections):  # as grpc.aio does: their callers see the channel go
            conn.processor.close("server stopped")
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.path).st_ino == self._inode:  # not a successor's socket, bound while this one drained
                os.unlink(self.path)


class _Server(Server):
    """grpclib's server, keeping its connections: a stop past the grace closes them (grpclib leaves them open)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.connections: weakref.WeakSet[H2Protocol] = weakref.WeakSet()

    def _protocol_factory(self) -> H2Protocol:  # grpclib's own, with _Protocol
        self.__gc_step__()
        calls = _Calls(self._mapping, self._codec, self._status_details_codec, self.__dispatch__)
        self._handlers.add(calls)
        protocol = _Protocol(calls, self._config, self._h2_config)
        self.connections.add(protocol)
        return protocol


# Envoy sends DATA frames as large as the peer allows, 16 KiB by default: each is an h2 event, a
# buffer entry and a window update in Python, which a 30 MB image body pays 1,900 times.
MAX_FRAME = 1 << 20


class _Protocol(H2Protocol):
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.connection._connection.update_settings({SettingCodes.MAX_FRAME_SIZE: MAX_FRAME})
        self.connection.flush()


class _Mapping:
    def __init__(self, mapping: dict[str, Handler]) -> None:
        self._mapping = mapping

    def __mapping__(self) -> dict[str, Handler]:
        return self._mapping
