"""`modelyard.probe` against real servers: a gRPC health service in each state, HTTP and TCP."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from modelyard.probe import probe_grpc, probe_http, probe_tcp
from tests.stack_config import free_port


async def test_grpc_probe_follows_the_health_service() -> None:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        address = f"127.0.0.1:{port}"
        await servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert await asyncio.to_thread(probe_grpc, address, 3.0) is None
        # Draining (SIGTERM): the probe fails, so Docker and Kubernetes stop sending it work.
        await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await asyncio.to_thread(probe_grpc, address, 3.0) == "gRPC health: NOT_SERVING"
    finally:
        await server.stop(None)
    why = await asyncio.to_thread(probe_grpc, address, 1.0)
    assert why is not None and why.startswith("gRPC health check failed: UNAVAILABLE")


def test_http_and_tcp_probes() -> None:
    port = free_port()
    assert probe_tcp(f"127.0.0.1:{port}", 1.0) is not None
    assert probe_http(f"http://127.0.0.1:{port}/", 1.0) is not None
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if probe_tcp(f"127.0.0.1:{port}", 1.0) is None:
                break
            time.sleep(0.05)
        assert probe_tcp(f"127.0.0.1:{port}", 1.0) is None
        assert probe_http(f"http://127.0.0.1:{port}/", 2.0) is None
        assert probe_http(f"http://127.0.0.1:{port}/no-such-file", 2.0) == "HTTP 404"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_module_exit_status() -> None:
    out = subprocess.run([sys.executable, "-m", "modelyard.probe", "tcp", f"127.0.0.1:{free_port()}"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and out.stderr.startswith("modelyard probe: unhealthy: TCP connect")
