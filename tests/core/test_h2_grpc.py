"""extproc/h2_grpc.py: grpc.aio servicers served straight on h2 on a Unix socket, called by grpcio's own
client (a part nobody here wrote), as Envoy calls the socket: every cardinality, raw bytes, metadata,
aborts and errors, deadlines, size limits, flow control both ways, broken peers, and a drain that lets
open calls finish and refuses new ones. The whole through Envoy: tests/e2e/test_extproc_socket_servers.py."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from extproc.grpc_services import Services
from extproc.h2_grpc import MAX_FRAME, H2GrpcServer

SERVICE = "test.Shell"
LIMIT = 9 << 20
cancelled: list[str] = []


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _who(request: bytes, context: Any) -> bytes:
    meta = dict(context.invocation_metadata())
    return f"{meta.get('x-tenant')}|{meta.get('x-trace-bin')!r}".encode()


async def _refuse(request: bytes, context: Any) -> bytes:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid or missing API key: 100% sure")
    raise AssertionError("abort returns only by raising")


async def _crash(request: bytes, context: Any) -> bytes:
    raise RuntimeError("a bug in a handler")


async def _sleep(request: bytes, context: Any) -> bytes:
    try:
        await asyncio.sleep(float(request))
    except asyncio.CancelledError:
        cancelled.append("sleep")
        raise
    return b"woke"


async def _count(request: bytes, context: Any) -> AsyncIterator[bytes]:
    for i in range(int(request)):
        yield str(i).encode()


async def _chat(requests: object, context: Any) -> None:
    # the ExternalProcessor's way: read() until EOF, a write() per message
    try:
        while (got := await context.read()) is not grpc.aio.EOF:
            if got == b"slow":
                await asyncio.sleep(0.5)
            await context.write(b"re:" + got)
    except asyncio.CancelledError:
        cancelled.append("chat")
        raise


async def _total(requests: AsyncIterator[bytes], context: Any) -> bytes:
    return b"+".join([r async for r in requests])


def _handlers() -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(SERVICE, {
        "Echo": grpc.unary_unary_rpc_method_handler(_echo),
        "Who": grpc.unary_unary_rpc_method_handler(_who),
        "Refuse": grpc.unary_unary_rpc_method_handler(_refuse),
        "Crash": grpc.unary_unary_rpc_method_handler(_crash),
        "Sleep": grpc.unary_unary_rpc_method_handler(_sleep),
        "Count": grpc.unary_stream_rpc_method_handler(_count),
        "Chat": grpc.stream_stream_rpc_method_handler(_chat),
        "Total": grpc.stream_unary_rpc_method_handler(_total),
    })


class Served:
    def __init__(self, aio: grpc.aio.Server, socket: H2GrpcServer, checks: Any) -> None:
        self.aio, self.socket, self.checks = aio, socket, checks

    def channel(self) -> grpc.aio.Channel:
        return grpc.aio.insecure_channel(f"unix:{self.socket.path}", options=[
            ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])


@contextlib.asynccontextmanager
async def _served() -> AsyncIterator[Served]:
    aio = grpc.aio.server()
    services = Services(aio)
    services.add_generic_rpc_handlers([_handlers()])
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, services)
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    path = str(Path(tempfile.mkdtemp(prefix="h2grpc-", dir="/tmp")) / "s.sock")
    Path(path).write_text("left by a killed process")  # a stale file at the path is replaced
    socket = H2GrpcServer(services, path, max_message=LIMIT)
    await socket.start()
    try:
        yield Served(aio, socket, checks)
    finally:
        if not socket.draining:
            await socket.stop(0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with _served() as s:
        yield s


def _method(ch: grpc.aio.Channel, kind: str, name: str) -> Any:
    return getattr(ch, kind)(f"/{SERVICE}/{name}")


async def test_the_grpc_aio_server_gets_the_same_handlers() -> None:
    aio = grpc.aio.server()
    services = Services(aio)
    services.add_generic_rpc_handlers([_handlers()])
    port = aio.add_insecure_port("127.0.0.1:0")
    await aio.start()
    try:
        assert sorted(services.handlers) == sorted(f"/{SERVICE}/{m}" for m in
                                                   ("Echo", "Who", "Refuse", "Crash", "Sleep", "Count", "Chat", "Total"))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert await _method(ch, "unary_unary", "Echo")(b"over tcp") == b"over tcp"
    finally:
        await aio.stop(0)


async def _every_cardinality(served: Served) -> None:
    async with served.channel() as ch:
        assert await _method(ch, "unary_unary", "Echo")(b"\x00raw\xff") == b"\x00raw\xff"
        assert await _method(ch, "unary_unary", "Echo")(b"") == b""
        who = await _method(ch, "unary_unary", "Who")(b"", metadata=(("x-tenant", "acme"), ("x-trace-bin", b"\x01\x02")))
        assert who == b"acme|b'\\x01\\x02'"
        assert [r async for r in _method(ch, "unary_stream", "Count")(b"3")] == [b"0", b"1", b"2"]
        call = _method(ch, "stream_stream", "Chat")()
        for word in (b"a", b"b"):
            await call.write(word)
            assert await call.read() == b"re:" + word
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK

        async def parts() -> AsyncIterator[bytes]:
            for p in (b"1", b"2", b"3"):
                yield p
        assert await _method(ch, "stream_unary", "Total")(parts()) == b"1+2+3"


async def test_every_cardinality_raw_bytes_and_metadata(served: Served) -> None:
    await _every_cardinality(served)


def test_every_cardinality_on_uvloop() -> None:
    # The extproc runs on uvloop, whose transports are not asyncio's classes.
    async def main() -> None:
        async with _served() as s:
            await _every_cardinality(s)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


async def test_abort_errors_and_unknown_methods_are_grpc_statuses(served: Served) -> None:
    async with served.channel() as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _method(ch, "unary_unary", "Refuse")(b"")
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert refused.value.details() == "invalid or missing API key: 100% sure"  # percent-encoded on the wire
        with pytest.raises(grpc.aio.AioRpcError) as crashed:
            await _method(ch, "unary_unary", "Crash")(b"")
        assert crashed.value.code() == grpc.StatusCode.UNKNOWN
        assert "a bug" not in (crashed.value.details() or "")  # nothing of our internals goes to the caller
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _method(ch, "unary_unary", "Nope")(b"")
        assert unknown.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert await _method(ch, "unary_unary", "Echo")(b"still here") == b"still here"


async def test_health_check_and_watch_follow_the_status(served: Served) -> None:
    async with served.channel() as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        assert (await stub.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        await served.checks.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await stub.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_large_messages_flow_both_ways(served: Served) -> None:
    # 8 MB each way: past the socket's 4 MiB windows and grpcio's own, so both sides wait on window updates.
    big = bytes(range(256)) * (8 << 12)
    async with served.channel() as ch:
        got = await asyncio.gather(*(_method(ch, "unary_unary", "Echo")(big[i:] + big[:i]) for i in range(3)))
        assert got == [big[i:] + big[:i] for i in range(3)]
        call = _method(ch, "stream_stream", "Chat")()
        await call.write(big)
        assert await call.read() == b"re:" + big
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK


async def test_a_message_over_the_limit_is_refused_and_the_connection_stays(served: Served) -> None:
    async with served.channel() as ch:
        with pytest.raises(grpc.aio.AioRpcError) as over:
            await _method(ch, "unary_unary", "Echo")(b"x" * (LIMIT + 1))
        assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await _method(ch, "unary_unary", "Echo")(b"small") == b"small"


async def test_a_deadline_cancels_the_handler(served: Served) -> None:
    cancelled.clear()
    async with served.channel() as ch:
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await _method(ch, "unary_unary", "Sleep")(b"5", timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await _method(ch, "unary_unary", "Sleep")(b"0", timeout=5) == b"woke"
    await asyncio.sleep(0.1)
    assert cancelled == ["sleep"]


async def test_a_caller_that_goes_away_cancels_its_handler(served: Served) -> None:
    cancelled.clear()
    async with served.channel() as ch:
        call = _method(ch, "stream_stream", "Chat")()
        await call.write(b"hello")
        assert await call.read() == b"re:hello"
        call.cancel()  # an RST_STREAM, as Envoy sends once a request is done
        for _ in range(50):
            if cancelled:
                break
            await asyncio.sleep(0.02)
        assert cancelled == ["chat"]
        assert not served.socket.connections or all(not c.calls for c in served.socket.connections)
        assert await _method(ch, "unary_unary", "Echo")(b"after") == b"after"


async def test_many_streams_at_once_on_one_connection(served: Served) -> None:
    # More than h2's default of 100 concurrent streams: Envoy multiplexes every request on few connections.
    async with served.channel() as ch:
        calls = [_method(ch, "stream_stream", "Chat")() for _ in range(300)]
        for i, call in enumerate(calls):
            await call.write(str(i).encode())
        assert [await c.read() for c in calls] == [f"re:{i}".encode() for i in range(300)]
        for call in calls:
            await call.done_writing()
        assert {await c.code() for c in calls} == {grpc.StatusCode.OK}


async def test_a_peer_that_sends_garbage_is_hung_up_on_and_the_server_stays(served: Served) -> None:
    reader, writer = await asyncio.open_unix_connection(served.socket.path)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) is not None  # read to EOF: the server closed it
    writer.close()
    async with served.channel() as ch:
        assert await _method(ch, "unary_unary", "Echo")(b"next") == b"next"


async def test_a_compressed_message_is_refused(served: Served) -> None:
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    reader, writer = await asyncio.open_unix_connection(served.socket.path)
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/Echo"),
                            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"),
                            ("grpc-encoding", "gzip")])
    client.send_data(1, b"\x01\x00\x00\x00\x02hi", end_stream=True)
    writer.write(client.data_to_send())
    trailers: dict[bytes, bytes] = {}
    deadline = asyncio.get_running_loop().time() + 5
    while not trailers and asyncio.get_running_loop().time() < deadline:
        for ev in client.receive_data(await asyncio.wait_for(reader.read(65536), 5)):
            if isinstance(ev, h2.events.TrailersReceived | h2.events.ResponseReceived):
                trailers.update(dict(ev.headers))
        writer.write(client.data_to_send())
        trailers = trailers if b"grpc-status" in trailers else {}
    writer.close()
    assert trailers[b"grpc-status"] == str(grpc.StatusCode.UNIMPLEMENTED.value[0]).encode()


async def test_stop_lets_an_open_stream_finish_and_refuses_new_calls(served: Served) -> None:
    async with served.channel() as ch:
        call = _method(ch, "stream_stream", "Chat")()
        await call.write(b"first")
        assert await call.read() == b"re:first"
        stopping = asyncio.create_task(served.socket.stop(5))
        await asyncio.sleep(0.2)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await _method(ch, "unary_unary", "Echo")(b"late")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        await call.write(b"second")  # the open stream is still served while the server drains
        assert await call.read() == b"re:second"
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        await asyncio.wait_for(stopping, 5)
    assert not Path(served.socket.path).exists()


async def test_stop_cancels_what_is_still_open_after_the_grace(served: Served) -> None:
    async with served.channel() as ch:
        call = _method(ch, "stream_stream", "Chat")()
        await call.write(b"open")
        assert await call.read() == b"re:open"
        started = asyncio.get_running_loop().time()
        await served.socket.stop(0.3)  # the stream never ends on its own: cut after the grace
        assert asyncio.get_running_loop().time() - started < 3
        assert await call.code() == grpc.StatusCode.UNAVAILABLE


async def test_peers_may_send_large_frames(served: Served) -> None:
    # A 30 MB image body in 16 KiB DATA frames is 1,900 h2 events in Python; the socket allows 1 MiB.
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    reader, writer = await asyncio.open_unix_connection(served.socket.path)
    writer.write(client.data_to_send())
    deadline = asyncio.get_running_loop().time() + 5
    # The server's SETTINGS may come in more than one frame and read: read until ours is in, or 5 s.
    while client.remote_settings.max_frame_size != MAX_FRAME and asyncio.get_running_loop().time() < deadline:
        with contextlib.suppress(asyncio.TimeoutError):
            client.receive_data(await asyncio.wait_for(reader.read(65536), 0.5))
        writer.write(client.data_to_send())
    writer.close()
    assert client.remote_settings.max_frame_size == MAX_FRAME == 1 << 20


async def test_stop_leaves_a_successors_socket_in_place(served: Served) -> None:
    # A process that took the path over while this one drained keeps its socket file.
    successor = H2GrpcServer(Services(grpc.aio.server()), served.socket.path)
    await successor.start()
    try:
        await served.socket.stop(0)
        assert Path(served.socket.path).is_socket()
    finally:
        await successor.stop(0)
    assert not Path(served.socket.path).exists()


async def test_a_stop_before_the_start_leaves_nothing_to_do(tmp_path: Path) -> None:
    # ExtprocServer makes the socket's server with itself; a start that failed earlier still stops.
    never = H2GrpcServer(Services(grpc.aio.server()), str(tmp_path / "never.sock"))
    await never.stop(0)
    assert not (tmp_path / "never.sock").exists()
    bound = H2GrpcServer(Services(grpc.aio.server()), str(tmp_path / "bound.sock"))
    bound.bind()  # the extproc binds the socket with the TCP port, before its loop serves either
    assert (tmp_path / "bound.sock").is_socket()
    await bound.stop(0)
    assert not (tmp_path / "bound.sock").exists()


async def _raw_chat(served: Served, pieces: list[bytes], replies: int) -> list[bytes]:
    """A Chat call from h2's own client, its request bytes cut into DATA frames exactly as given."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    reader, writer = await asyncio.open_unix_connection(served.socket.path)
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/Chat"),
                            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    for piece in pieces:
        client.send_data(1, piece)
    writer.write(client.data_to_send())
    got = bytearray()
    deadline = asyncio.get_running_loop().time() + 5
    while asyncio.get_running_loop().time() < deadline:
        for ev in client.receive_data(await asyncio.wait_for(reader.read(65536), 5)):
            if isinstance(ev, h2.events.DataReceived):
                got += ev.data
                client.acknowledge_received_data(ev.flow_controlled_length, 1)
        writer.write(client.data_to_send())
        out, rest = [], bytes(got)
        while len(rest) >= 5 and len(rest) >= 5 + int.from_bytes(rest[1:5], "big"):
            n = int.from_bytes(rest[1:5], "big")
            out.append(rest[5:5 + n])
            rest = rest[5 + n:]
        if len(out) >= replies:
            writer.close()
            return out
    raise AssertionError(f"{len(got)} bytes of replies in 5 s")


async def test_messages_cut_anywhere_across_frames(served: Served) -> None:
    # A prefix split over two frames, an empty message, two messages in one frame, a body over two.
    pieces = [b"\x00\x00\x00", b"\x00\x02hi\x00\x00\x00\x00\x00", b"\x00\x00\x00\x00\x03ab", b"c"]
    assert await _raw_chat(served, pieces, 3) == [b"re:hi", b"re:", b"re:abc"]
