"""Upstream TLS through a real Envoy: the certificate is verified against the deployment's CA and
its SANs, mTLS presents the client certificate, and only an explicit opt-out skips verification.

One stack (extproc + Envoy), one model per case, each pointing at a demo OpenAI upstream served
over HTTPS on 127.0.0.1 with certificates made for this run."""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from devstack.demo import openai_server
from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack
from tests.tls_certs import Leaf, TestCA

pytestmark = pytest.mark.e2e


class TlsUpstream:
    """The demo OpenAI server behind TLS, on its own event loop in a thread."""

    def __init__(self, leaf: Leaf, *, client_ca: Path | None = None):
        self.port = free_port()
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(leaf.cert, leaf.key)
        if client_ca:  # mTLS: refuse a client without a certificate from this CA
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(client_ca)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> TlsUpstream:
        self.thread.start()
        self.runner = web.AppRunner(openai_server.make_app(name=f"tls-{self.port}"))
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port, ssl_context=self.ctx).start()

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def _model(name: str, port: int, **tls: object) -> dict:
    return {"name": name, "deployments": [{"cluster": name, "protocol": "openai", "tls": True,
                                           "endpoints": [f"127.0.0.1:{port}"], **tls}]}


@pytest.fixture(scope="module")
def tls_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    work = tmp_path_factory.mktemp("tls")
    ca = TestCA(work / "ca")
    good = ca.leaf("upstream", ["IP:127.0.0.1"])
    wrong_san = ca.leaf("elsewhere", ["DNS:elsewhere.example", "IP:127.0.0.2"])
    client = ca.leaf("gateway", ["DNS:gateway.example"], usage="clientAuth")
    with TlsUpstream(good) as ok, TlsUpstream(wrong_san) as other, TlsUpstream(good, client_ca=ca.cert) as mtls:
        data = small_config()
        data["models"] = [
            _model("tls-good", ok.port, tls_ca_file=str(ca.cert)),
            _model("tls-system-ca", ok.port),  # the default trust: the system bundle does not know our CA
            _model("tls-wrong-san", other.port, tls_ca_file=str(ca.cert)),
            _model("tls-insecure", other.port, tls_insecure_skip_verify=True),
            _model("tls-mtls", mtls.port, tls_ca_file=str(ca.cert), tls_client_cert_file=str(client.cert),
                   tls_client_key_file=str(client.key)),
            _model("tls-mtls-no-cert", mtls.port, tls_ca_file=str(ca.cert)),
        ]
        with start_stack(work, data, demos=False) as stack:
            yield stack


def _chat(stack: object, model: str) -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/chat/completions", timeout=20,  # type: ignore[attr-defined]
                      json={"model": model, "messages": [{"role": "user", "content": "over tls"}]},
                      headers={"authorization": f"Bearer {DEMO_KEY}"})


def _cluster_stats(stack: object) -> dict[str, int]:
    text = httpx.get(f"{stack.admin_url()}/stats?filter=^cluster\\.tls-", timeout=5).text  # type: ignore[attr-defined]
    return {k: int(v) for k, _, v in (line.partition(": ") for line in text.splitlines()) if v.strip().isdigit()}


@pytest.mark.parametrize("model", ["tls-good", "tls-insecure", "tls-mtls"])
def test_verified_upstreams_answer(tls_stack: object, model: str) -> None:
    stack = tls_stack
    r = _chat(stack, model)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].endswith("echo: over tls")


@pytest.mark.parametrize("model,stat", [
    ("tls-system-ca", "cluster.tls-system-ca.ssl.fail_verify_error"),   # chain not trusted
    ("tls-wrong-san", "cluster.tls-wrong-san.ssl.fail_verify_san"),      # trusted, but for another name
    # The server wants a client certificate: it hangs up on the handshake.
    ("tls-mtls-no-cert", "cluster.tls-mtls-no-cert.upstream_cx_connect_fail"),
])
def test_unverifiable_upstreams_fail(tls_stack: object, model: str, stat: str) -> None:
    stack = tls_stack
    r = _chat(stack, model)
    # Envoy answers 503 (connection failure, after its retry); the gateway reports an upstream's 5xx as
    # 502 in the caller's shape. Neither the upstream's bytes nor Envoy's TLS failure reason reach the
    # caller (the reason is in Envoy's stats, checked below, and the extproc's INFO log).
    task = r.headers["x-modelyard-task-id"]
    assert r.status_code == 502 and r.json()["error"]["message"] == f"upstream error (HTTP 503) (task {task})", r.text
    assert "TLS" not in r.text and "reset reason" not in r.text
    stats = _cluster_stats(stack)
    assert stats.get(stat, 0) >= 1 and stats.get(f"cluster.{model}.upstream_rq_503", 0) >= 1, stats
