"""The real grpc.aio service: health, a stream across SIGTERM (drained, not cut), exit code 0."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import orjson
import pytest
import yaml
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from extproc.server import UNREADY_BEFORE_DRAIN_S
from tests.core.session_driver import body_msg, chat_headers, headers_msg
from tests.stack_config import free_port, without_watermarks

ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, **extproc: object) -> tuple[subprocess.Popen[bytes], str]:
    """`modelyard serve` on the shipped config with these extproc settings; (the process, its TCP address)."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    addr = f"127.0.0.1:{free_port()}"
    data["extproc"] = {"address": addr, "metrics_address": f"127.0.0.1:{free_port()}", "drain_seconds": 10, **extproc}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return subprocess.Popen([sys.executable, "-m", "modelyard.cli", "serve", "--config", str(cfg)]), addr


def _first_connect(proc: subprocess.Popen[bytes], addr: str) -> None:
    """Return as soon as the TCP port takes a connection: what a supervisor or a test stack calls "up"."""
    host, _, port = addr.rpartition(":")
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "the extproc never listened"
        try:
            socket.create_connection((host, int(port)), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.002)


async def _serving(ch: grpc.aio.Channel) -> health_pb2_grpc.HealthStub:
    await asyncio.wait_for(ch.channel_ready(), 20)
    health = health_pb2_grpc.HealthStub(ch)
    r = await health.Check(health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor"))
    assert r.status == health_pb2.HealthCheckResponse.SERVING
    return health


async def test_sigterm_drains_open_stream(tmp_path: Path) -> None:
    proc, addr = _serve(tmp_path)
    try:
        async with grpc.aio.insecure_channel(addr) as ch:
            await _serving(ch)
            call = ext_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg(chat_headers()))
            first = await call.read()
            assert first.WhichOneof("response") == "request_headers"
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            body = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})
            await call.write(body_msg(body))
            second = await call.read()
            assert second.WhichOneof("response") == "request_body"
            await call.done_writing()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_taken_port_stops_the_start_instead_of_sharing_it(tmp_path: Path) -> None:
    # gRPC binds with SO_REUSEPORT unless told not to: a second extproc would split the first one's calls.
    other = grpc.aio.server()
    port = other.add_insecure_port("127.0.0.1:0")
    await other.start()
    try:
        data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
        data["extproc"] = {"address": f"127.0.0.1:{port}", "metrics_address": f"127.0.0.1:{free_port()}"}
        cfg = tmp_path / "c.yaml"
        cfg.write_text(yaml.safe_dump(data))
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "modelyard.cli", "serve", "--config",
                                                         str(cfg)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1
        assert f"127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    finally:
        await other.stop(0)


async def test_sigterm_drains_the_h2_socket_too(tmp_path: Path) -> None:
    # Envoy's way in when local: the Unix socket, served straight on h2 (extproc/h2_grpc.py).
    sock = str(Path(tempfile.mkdtemp(prefix="drain-", dir="/tmp")) / "x.sock")
    proc, _ = _serve(tmp_path, unix_socket=sock)
    try:
        async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
            health = await _serving(ch)
            call = ext_grpc.ExternalProcessorStub(ch).Process()
            await call.write(headers_msg(chat_headers()))
            assert (await call.read()).WhichOneof("response") == "request_headers"
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)  # told NOT_SERVING first, so Envoy's health check takes it out
            r = await health.Check(health_pb2.HealthCheckRequest(service="envoy.service.ext_proc.v3.ExternalProcessor"))
            assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
            await asyncio.sleep(UNREADY_BEFORE_DRAIN_S + 0.5)  # now draining: new calls are refused
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await health.Check(health_pb2.HealthCheckRequest())
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            body = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})
            await call.write(body_msg(body))  # the open stream is served to its end
            assert (await call.read()).WhichOneof("response") == "request_body"
            await call.done_writing()
        assert proc.wait(timeout=20) == 0
        assert not Path(sock).exists()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_socket_is_bound_once_the_tcp_port_answers(tmp_path: Path) -> None:
    # A restart after a SIGKILL: the dead process's socket file is still there and refuses connections.
    # Readiness is the TCP port (devstack's supervisor and the test stacks wait for it), so by the time
    # it answers, Envoy's way in must answer too (a CI run got 503s in that gap, before the order was fixed).
    sock = str(Path(tempfile.mkdtemp(prefix="order-", dir="/tmp")) / "x.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(sock)
    stale.close()  # the file stays, nobody listens
    proc, addr = _serve(tmp_path, unix_socket=sock)
    try:
        _first_connect(proc, addr)
        unix = socket.socket(socket.AF_UNIX)
        unix.connect(sock)  # refused if the TCP port opened first
        unix.close()
    finally:
        proc.kill()
        proc.wait(10)


def test_metrics_answer_once_the_tcp_port_answers(tmp_path: Path) -> None:
    # The TCP port accepts connections from the moment it is bound, before the pollers' first readings (up
    # to 2 s from a slow watermark agent). Whoever takes it for "up" may read /metrics at once: a chaos
    # test's first metric read got "connection refused" in that gap, before /metrics came first.
    import httpx

    silent = socket.socket()  # a watermark agent that takes the connection and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    for m in data["models"]:
        for d in m["deployments"]:
            if "watermark" in d:
                d["watermark"] = {"url": f"http://127.0.0.1:{silent.getsockname()[1]}/watermarks"}
    addr, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    data["extproc"] = {"address": addr, "metrics_address": metrics}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen([sys.executable, "-m", "modelyard.cli", "serve", "--config", str(cfg)])
    try:
        _first_connect(proc, addr)
        assert httpx.get(f"http://{metrics}/metrics", timeout=5).status_code == 200
    finally:
        proc.kill()
        proc.wait(10)
        silent.close()
