"""Credentials stay out of what others can read, on a real stack (every demo upstream, Envoy with a
JSON access log to a file): no key on any child's command line, none in the access log or in any
process's log, whatever the answer (200, 400, 401, 404) and wherever the caller put its key."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from controlplane.environments import EnvironmentConfig
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

WRONG = {"bearer": "sk-wrong-bearer-3c9d1e", "x-api-key": "sk-ant-wrong-8b21fa", "x-goog-api-key": "goog-wrong-4e7a90",
         "query": "goog-wrong-query-d05c"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    workdir = tmp_path_factory.mktemp("edge")
    data, _ = demo_config_free_ports()
    env = EnvironmentConfig.model_validate({
        "name": "test", "admin": {"address": "127.0.0.1", "port": 0}, "concurrency": 1,
        "access_log": {"path": str(workdir / "access.log"), "format": "json"},
        "edge": {"request_headers_timeout_s": 1}})
    with start_stack(workdir, data, env, shared_demos=True) as s:
        yield s


def _secrets() -> dict[str, str]:
    return {"demo key": DEMO_KEY, **{f"wrong {k}": v for k, v in WRONG.items()},
            **{f"${k}": os.environ[k] for k in UPSTREAM_KEYS}}


def test_no_key_on_any_command_line(stack) -> None:
    children = [c for c in stack.children if c.proc is not None]
    assert any("devstack.demo.openai_server" in c.argv for c in children)  # its own or the shared demo host
    for child in children:
        cmdline = Path(f"/proc/{child.proc.pid}/cmdline").read_bytes().decode(errors="replace")
        for what, secret in _secrets().items():
            assert secret not in cmdline, f"{what} on {child.name}'s command line"
    # The demos still hold the key (from the environment): a 200 through the gateway proves it.
    r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=10, headers={"authorization": f"Bearer {DEMO_KEY}"},
                   json={"model": "demo-gpt", "messages": [{"role": "user", "content": "keys"}]})
    assert r.status_code == 200 and r.headers["x-modelyard-cluster"] == "demo-openai", r.text


def test_slow_header_block_gets_408(stack) -> None:
    host, _, port = stack.url.removeprefix("http://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        start = time.monotonic()
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n")  # and never the blank line
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
        assert time.monotonic() - start < 6
    assert received.startswith(b"HTTP/1.1 408"), received[:200]


def _chat(text: str) -> dict:
    return {"model": "demo-gpt", "messages": [{"role": "user", "content": text}]}


def _anthropic(text: str) -> dict:
    return {"model": "demo-claude", "max_tokens": 64, "messages": [{"role": "user", "content": text}]}


GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


def test_no_credential_in_any_log(stack) -> None:
    base = stack.url
    gemini = f"{base}/v1beta/models/demo-gemini"
    calls = [  # (method, url, headers, json or raw body, expected status)
        ("POST", f"{base}/v1/chat/completions", {"authorization": f"Bearer {DEMO_KEY}"}, _chat("ok"), 200),
        ("POST", f"{base}/v1/chat/completions", {"authorization": f"Bearer {WRONG['bearer']}"}, _chat("x"), 401),
        ("POST", f"{base}/v1/chat/completions", {"authorization": f"Bearer {DEMO_KEY}"},
         {**_chat("x"), "model": "nope"}, 404),
        ("POST", f"{base}/v1/chat/completions", {"authorization": f"Bearer {DEMO_KEY}",
                                                 "content-type": "application/json"}, b"{oops", 400),
        ("POST", f"{base}/v1/messages", {"x-api-key": DEMO_KEY, "anthropic-version": "2023-06-01"},
         _anthropic("ok"), 200),
        ("POST", f"{base}/v1/messages", {"x-api-key": WRONG["x-api-key"], "anthropic-version": "2023-06-01"},
         _anthropic("x"), 401),
        ("POST", f"{gemini}:generateContent", {"x-goog-api-key": DEMO_KEY}, GEMINI_BODY, 200),
        ("POST", f"{gemini}:generateContent", {"x-goog-api-key": WRONG["x-goog-api-key"]}, GEMINI_BODY, 401),
        ("POST", f"{gemini}:generateContent?key={DEMO_KEY}", {}, GEMINI_BODY, 200),
        ("POST", f"{gemini}:streamGenerateContent?alt=sse&key={DEMO_KEY}", {}, GEMINI_BODY, 200),
        ("POST", f"{gemini}:generateContent?key={WRONG['query']}", {}, GEMINI_BODY, 401),
        ("POST", f"{base}/v1beta/models/nope:generateContent?key={DEMO_KEY}", {}, GEMINI_BODY, 404),
        ("GET", f"{base}/v1/models?key={DEMO_KEY}", {"authorization": f"Bearer {DEMO_KEY}"}, None, 200),
    ]
    with httpx.Client(timeout=20) as client:
        for method, url, headers, body, status in calls:
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = client.request(method, url, headers=headers, **kwargs)
            assert r.status_code == status, (url, r.status_code, r.text[:300])
    stack.stop()  # every process flushes its logs (Envoy writes the access log on a timer)
    access = Path(stack.env.access_log.path).read_text()
    assert len(access.splitlines()) >= len(calls) and "generateContent" in access
    logs = {p.name: p.read_bytes().decode(errors="replace") for p in Path(stack.log_dir).iterdir() if p.is_file()}
    assert any(name.startswith("extproc") for name in logs) and any(name.startswith("envoy") for name in logs)
    for name, text in logs.items():
        for what, secret in _secrets().items():
            assert secret not in text, f"{what} in {name}"
