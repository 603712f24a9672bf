"""The bench's floor: a do-nothing ext_proc behind Modelyard's own Envoy config still serves the request."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from bench.bench_gateway import BODY, HEADERS, _floor_stack
from bench.floor_extproc import replies
from controlplane.environments import EnvironmentConfig
from tests.conftest import UPSTREAM_KEYS


def test_a_reply_for_every_message_envoy_sends() -> None:
    table = replies("demo-openai")
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
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "[demo-openai] echo: hello from the benchmark"
