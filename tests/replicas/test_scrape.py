"""The board's kept-open /metrics scrape against real HTTP servers: aiohttp's (keep-alive, chunked,
closing) and a raw socket one for the shapes aiohttp never sends (HTTP/1.0 bodies that run to the
close, a response cut short); and the board skipping the parse of an unchanged exposition."""

import asyncio

import pytest
from aiohttp import web

from contracts.config.balancing import ReplicaMetrics
from devstack.demo.adapter_server import vllm_metrics
from extproc.replicas.board import ReplicaBoard, ReplicaSet
from extproc.replicas.exposition import MetricsParseError
from extproc.replicas.scrape import MetricsScrape


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


@pytest.fixture
async def server():
    state = {"waiting": 0, "peers": set(), "status": 200}

    async def metrics(request: web.Request) -> web.StreamResponse:
        state["peers"].add(request.transport.get_extra_info("peername"))
        text = vllm_metrics(state["waiting"], 1, 0.25)
        if state["status"] != 200:
            return web.Response(status=state["status"], text="off")
        return web.Response(text=text)

    async def chunked(_: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(_)
        text = vllm_metrics(3, 2, 0.5).encode()
        for i in range(0, len(text), 100):
            await resp.write(text[i:i + 100])
        await resp.write_eof()
        return resp

    async def closing(_: web.Request) -> web.StreamResponse:
        return web.Response(text=vllm_metrics(1, 1, 0.1), headers={"Connection": "close"})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/closing", closing)
    runner, port = await _serve(app)
    yield state, port
    await runner.cleanup()


async def test_one_connection_serves_every_poll(server):
    state, port = server
    scrape = MetricsScrape("127.0.0.1", port, "/metrics")
    for waiting in (0, 4, 7):
        state["waiting"] = waiting
        assert await scrape.get() == (200, vllm_metrics(waiting, 1, 0.25).encode())
    assert len(state["peers"]) == 1  # kept open between polls
    state["status"] = 503
    assert (await scrape.get())[0] == 503
    scrape.close()


async def test_chunked_and_closing_answers_read_whole(server):
    _, port = server
    status, body = await MetricsScrape("127.0.0.1", port, "/chunked").get()
    assert status == 200 and body == vllm_metrics(3, 2, 0.5).encode()
    closing = MetricsScrape("127.0.0.1", port, "/closing")
    for _ in range(3):  # the server closes each time: the next poll opens another connection
        status, body = await closing.get()
        assert status == 200 and body == vllm_metrics(1, 1, 0.1).encode()


async def _raw_server(answer: bytes) -> tuple[asyncio.AbstractServer, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, srv.sockets[0].getsockname()[1]


async def test_http10_body_runs_to_the_close_and_a_cut_answer_is_an_error():
    srv, port = await _raw_server(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nvllm:num_requests_waiting 2\n")
    async with srv:
        assert await MetricsScrape("127.0.0.1", port, "/metrics").get() == (200, b"vllm:num_requests_waiting 2\n")
    srv, port = await _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort")
    async with srv:
        with pytest.raises(ConnectionResetError):
            await MetricsScrape("127.0.0.1", port, "/metrics").get()
    srv, port = await _raw_server(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
    async with srv:
        with pytest.raises(MetricsParseError, match="not an HTTP"):
            await MetricsScrape("127.0.0.1", port, "/metrics").get()


async def test_a_stopped_server_is_a_failed_poll_and_the_next_one_reconnects(server):
    _, port = server
    scrape = MetricsScrape("127.0.0.1", port, "/metrics")
    assert (await scrape.get())[0] == 200
    with pytest.raises(OSError):
        await MetricsScrape("127.0.0.1", 1, "/metrics").get()  # nothing listens on port 1
    assert (await scrape.get())[0] == 200
    scrape.close()


async def test_board_parses_a_changed_exposition_and_restamps_an_unchanged_one(server, monkeypatch):
    state, port = server
    now = [100.0]
    board = ReplicaBoard([], clock=lambda: now[0])
    rs = ReplicaSet("c", [f"127.0.0.1:{port}"], ReplicaMetrics(kind="vllm", interval_ms=50))
    parsed = []
    import extproc.replicas.board as board_mod
    real = board_mod.parse_replica_metrics
    monkeypatch.setattr(board_mod, "parse_replica_metrics", lambda *a: parsed.append(1) or real(*a))
    board.sets["c"] = rs
    first = await board.poll_once(rs, rs.endpoints[0])
    now[0] = 100.05
    second = await board.poll_once(rs, rs.endpoints[0])
    assert first is not None and second is not None and len(parsed) == 1
    assert (second.waiting, second.at, first.at) == (first.waiting, 100.05, 100.0)
    state["waiting"] = 9
    third = await board.poll_once(rs, rs.endpoints[0])
    assert third is not None and third.waiting == 9 and len(parsed) == 2
    state["status"] = 503
    assert await board.poll_once(rs, rs.endpoints[0]) is None
    assert rs.readings[rs.endpoints[0]] is third  # a failed poll keeps the old reading
    await board.stop()
