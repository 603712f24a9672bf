"""The edge against a real Envoy, alone (no extproc: its filter fails closed with a 503, which is
enough to log a request): slow header blocks are cut, and access log lines carry no credential."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from contracts.config import parse_config
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import EnvironmentConfig
from devstack.launcher import envoy_binary
from tests.stack_config import free_port, small_config

SECRETS = {"bearer": "sk-bearer-secret-7f3a", "x-api-key": "sk-ant-header-secret-91c2",
           "x-goog-api-key": "goog-header-secret-55d0", "query": "goog-query-secret-e81b"}


class BareEnvoy:
    def __init__(self, workdir: Path, env: EnvironmentConfig):
        data = small_config()
        data["extproc"]["address"] = f"127.0.0.1:{free_port()}"  # nobody listens: ext_proc fails closed
        self.port = data["listener"]["port"]
        self.config = workdir / "envoy.yaml"
        self.config.write_text(render_bootstrap(parse_config(data), env))
        self.log = workdir / "envoy.log"
        self.admin_path = workdir / "admin.txt"

    def __enter__(self) -> BareEnvoy:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([envoy_binary(), "-c", str(self.config), "--concurrency", "1",
                                          "--disable-hot-restart", "--log-level", "warn",
                                          "--admin-address-path", str(self.admin_path)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"envoy not listening; see {self.log}")

    def stat(self, name: str) -> int:
        admin = self.admin_path.read_text().strip()
        return int(httpx.get(f"http://{admin}/stats?filter=^{name}$&format=json", timeout=5).json()["stats"][0]["value"])

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)


def _env(**fields: object) -> EnvironmentConfig:
    return EnvironmentConfig.model_validate({"name": "edge-test", "admin": {"address": "127.0.0.1", "port": 0},
                                             "concurrency": 1, **fields})


@pytest.fixture
def slow_envoy(tmp_path: Path) -> Iterator[BareEnvoy]:
    env = _env(edge={"request_headers_timeout_s": 1.0, "request_timeout_s": 30})
    with BareEnvoy(tmp_path, env) as envoy:
        yield envoy


def test_slow_header_block_is_cut(slow_envoy: BareEnvoy) -> None:
    """Slow-loris: a header block trickling in one line every 0.3 s is cut and the connection closed
    about request_headers_timeout_s after its first byte, however long the client keeps going."""
    sock = socket.create_connection(("127.0.0.1", slow_envoy.port), timeout=5)
    start = time.monotonic()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
    received = b""
    try:
        for i in range(30):  # would take 9 s to finish
            time.sleep(0.3)
            sock.sendall(f"x-slow-{i}: {'a' * 10}\r\n".encode())
    except OSError:
        pass  # Envoy closed the connection under us
    sock.settimeout(5)
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except OSError:
        pass
    elapsed = time.monotonic() - start
    sock.close()
    assert elapsed < 6, elapsed  # 1 s timeout, generous bound for a loaded machine
    # Envoy's 408 local reply still passes the ext_proc filter's response path, which fails closed
    # here (no extproc): a 503. Either way the connection is closed, and the stat says why.
    assert received == b"" or (received.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503"))
                               and b"connection: close" in received), received[:200]
    assert slow_envoy.stat("http.modelyard.downstream_rq_header_timeout") == 1


def test_complete_requests_are_not_cut(slow_envoy: BareEnvoy) -> None:
    # The same listener answers a normal request (the extproc being down: its 503, controlplane.local_replies).
    r = httpx.get(f"http://127.0.0.1:{slow_envoy.port}/v1/models", timeout=10)
    assert r.status_code == 503


def _send_credentials(port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=10) as c:
        c.post(f"{base}/v1/chat/completions", headers={"authorization": f"Bearer {SECRETS['bearer']}"}, json={})
        c.post(f"{base}/v1/messages", headers={"x-api-key": SECRETS["x-api-key"]}, json={})
        c.post(f"{base}/v1beta/models/demo:generateContent", headers={"x-goog-api-key": SECRETS["x-goog-api-key"]},
               json={})
        c.post(f"{base}/v1beta/models/demo:generateContent?key={SECRETS['query']}&alt=sse", json={})


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_access_log_holds_no_credential(tmp_path: Path, fmt: str) -> None:
    access = tmp_path / "access.log"
    with BareEnvoy(tmp_path, _env(access_log={"path": str(access), "format": fmt})) as envoy:
        _send_credentials(envoy.port)
    text = access.read_text()  # Envoy flushes the file when it stops
    assert len(text.splitlines()) == 4, text
    for name, secret in SECRETS.items():
        assert secret not in text, f"{name} credential in the access log"
    assert "/v1beta/models/demo:generateContent" in text and "?" not in text  # path logged, query not
    if fmt == "json":
        assert {json.loads(line)["path"] for line in text.splitlines()} == {
            "/v1/chat/completions", "/v1/messages", "/v1beta/models/demo:generateContent"}
