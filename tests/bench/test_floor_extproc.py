"""The bench's floor: a do-nothing ext_proc behind Modelyard's own Envoy config still serves the request."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from bench.bench_gateway import BODY, HEADERS, STREAM_BODY, _floor_stack
from bench.floor_extproc import replies
from controlplane.environments import EnvironmentConfig
from tests.conftest import UPSTREAM_KEYS


def test_a_reply_for_every_message_envoy_sends() -> None:
    table = replies("demo-openai")
    sse = table.pop("sse")  # an SSE answer's headers: switched to STREAMED, as Modelyard does
    assert sse.WhichOneof("response") == "response_headers"
    assert sse.mode_override.response_body_mode == processing_mode_pb2.ProcessingMode.STREAMED
    assert {k: r.WhichOneof("response") for k, r in table.items()} == {k: k for k in table}
    mutation = table["request_body"].request_body.response.header_mutation
    assert [(h.header.key, h.header.raw_value) for h in mutation.set_headers] == [
        ("x-modelyard-cluster", b"demo-openai")]
    assert table["request_body"].request_body.response.clear_route_cache


@pytest.mark.e2e
def test_the_floor_routes_through_envoy_to_the_upstream(tmp_path: Path) -> None:
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with _floor_stack(tmp_path / "floor", EnvironmentConfig(name="bench", admin=None, concurrency=1)) as stack:
        r = httpx.post(f"{stack.url}/v1/chat/completions", content=BODY, headers=HEADERS, timeout=10)
        streamed = httpx.post(f"{stack.url}/v1/chat/completions", content=STREAM_BODY, headers=HEADERS, timeout=10)
    assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    events = [ln for ln in streamed.text.splitlines() if ln.startswith("data: ")]
    assert len(events) > 100 and events[-1] == "data: [DONE]"  # the bench's ~100-chunk stream, whole
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "[demo-openai] echo: hello from the benchmark"


def test_a_work_level_says_whether_its_work_comes_after_the_reply() -> None:
    from bench.floor_work import _level
    assert _level("60") == (60.0, False)
    assert _level("a60") == (60.0, True)


@pytest.mark.e2e
def test_the_floor_with_work_after_each_reply_still_answers_every_message(tmp_path: Path) -> None:
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    stack = _floor_stack(tmp_path / "floor", EnvironmentConfig(name="bench", admin=None, concurrency=1))
    stack.child("extproc").argv += ["--after-us", "200"]
    with stack:
        got = [httpx.post(f"{stack.url}/v1/chat/completions", content=BODY, headers=HEADERS, timeout=10)
               for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 200], got[-1].text


@pytest.mark.e2e
@pytest.mark.parametrize("server", ["h2", "grpcio"])
def test_the_floor_over_each_socket_server(tmp_path: Path, server: str) -> None:
    # bench/floor_servers.py: Envoy reaches the floor over the Unix socket, served by h2 or grpc.aio.
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    env = EnvironmentConfig(name="bench", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)
    stack = _floor_stack(tmp_path / "floor", env, socket_server=server)
    with stack:
        assert (tmp_path / "floor" / "extproc.sock").is_socket()
        got = [httpx.post(f"{stack.url}/v1/chat/completions", content=BODY, headers=HEADERS, timeout=10)
               for _ in range(3)]
        streamed = httpx.post(f"{stack.url}/v1/chat/completions", content=STREAM_BODY, headers=HEADERS, timeout=10)
        cluster = httpx.get(f"{stack.admin_url()}/clusters", timeout=5).text
    assert [r.status_code for r in got] == [200, 200, 200], got[-1].text
    events = [ln for ln in streamed.text.splitlines() if ln.startswith("data: ")]
    assert len(events) > 100 and events[-1] == "data: [DONE]"
    # the extproc cluster's only endpoint is the socket, and it took the calls
    rows = [ln for ln in cluster.splitlines() if ln.startswith("modelyard-extproc::") and "rq_total" in ln]
    assert rows and all("extproc.sock" in ln for ln in rows), rows
    assert sum(int(ln.rpartition(":")[2]) for ln in rows) >= 4
