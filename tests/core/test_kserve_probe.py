"""The KServe upstream probe against a real gRPC v2 server (the demo one, in process): answers,
the brief cache, one call for concurrent askers, and a down upstream read as not ready."""

from __future__ import annotations

import asyncio

import pytest

from contracts.config import Deployment
from contracts.errors import NotFound, Unavailable
from devstack.demo import kserve_server
from extproc.vision.kserve_probe import KServeProbe
from tests.stack_config import free_port


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _dep(port: int, *more: int) -> Deployment:
    return Deployment(cluster="kserve-a", protocol="kserve-grpc",
                      endpoints=[f"127.0.0.1:{p}" for p in (port, *more)])


async def test_answers_come_from_the_server_and_are_cached() -> None:
    server = await kserve_server.start(0, models=["colors"])
    clock = Clock()
    probe = KServeProbe(ttl_s=2.0, clock=clock)
    try:
        dep = _dep(server.port)
        meta = await probe.model_metadata(dep, "colors", None)
        assert meta["name"] == "colors" and meta["inputs"][0]["shape"] == [-1, 3, -1, -1]
        assert await probe.model_ready(dep, "colors", None) and await probe.server_ready(dep)
        assert probe.calls == 3
        # Within the ttl: no new upstream call.
        await probe.model_metadata(dep, "colors", None)
        await probe.model_ready(dep, "colors", None)
        assert probe.calls == 3
        clock.now += 2.5
        await probe.model_ready(dep, "colors", None)
        assert probe.calls == 4
        with pytest.raises(NotFound):
            await probe.model_metadata(dep, "nope", None)
        assert not await probe.model_ready(dep, "nope", None)
    finally:
        await probe.close()
        await server.stop()


async def test_concurrent_askers_share_one_call() -> None:
    server = await kserve_server.start(0, models=["colors"])
    probe = KServeProbe()
    try:
        results = await asyncio.gather(*(probe.model_ready(_dep(server.port), "colors", "1") for _ in range(20)))
        assert all(results) and probe.calls == 1
    finally:
        await probe.close()
        await server.stop()


async def test_a_down_upstream_is_not_ready_and_asked_once_per_ttl() -> None:
    clock = Clock()
    probe = KServeProbe(ttl_s=2.0, timeout_s=1.0, clock=clock)
    dead = _dep(free_port())
    try:
        assert not await probe.server_ready(dead)
        assert not await probe.model_ready(dead, "colors", None)
        with pytest.raises(Unavailable):
            await probe.model_metadata(dead, "colors", None)
        calls = probe.calls
        with pytest.raises(Unavailable):  # the failure is remembered too
            await probe.model_metadata(dead, "colors", None)
        assert probe.calls == calls
    finally:
        await probe.close()


async def test_ready_when_any_endpoint_is() -> None:
    server = await kserve_server.start(0, models=["colors"])
    probe = KServeProbe(timeout_s=1.0)
    try:
        assert await probe.server_ready(_dep(free_port(), server.port))
    finally:
        await probe.close()
        await server.stop()


async def test_tls_upstream_is_verified_against_the_configured_ca(tmp_path) -> None:
    """The demo servicer on a TLS port: ready with the right CA, not ready with another one."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    from tests.tls_certs import TestCA

    ca, other = TestCA(tmp_path / "ca"), TestCA(tmp_path / "other", name="other-ca")
    leaf = ca.leaf("kserve", ["IP:127.0.0.1"])
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(kserve_server.KServeDemoServicer(models=["colors"]), server)
    port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials(
        [(leaf.key.read_bytes(), leaf.cert.read_bytes())]))
    await server.start()
    probe = KServeProbe(timeout_s=2.0)
    try:
        def tls_dep(cluster: str, ca_file) -> Deployment:
            return Deployment(cluster=cluster, protocol="kserve-grpc", endpoints=[f"127.0.0.1:{port}"], tls=True,
                              tls_ca_file=str(ca_file))

        assert await probe.model_ready(tls_dep("good", ca.cert), "colors", None)
        assert not await probe.model_ready(tls_dep("bad", other.cert), "colors", None)
        assert not await probe.server_ready(Deployment(cluster="plain", protocol="kserve-grpc",
                                                       endpoints=[f"127.0.0.1:{port}"]))
    finally:
        await probe.close()
        await server.stop(0)
