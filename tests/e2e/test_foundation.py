"""The spine through a real Envoy: routing by header, task ids, model list, errors, SDK."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY

pytestmark = pytest.mark.e2e


def _chat(model: str = "demo-gpt", text: str = "hello gateway") -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def test_chat_reaches_upstream_through_envoy(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(text="route me please"),
                   headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "[demo-openai] echo: route me please"
    assert len(r.headers["x-modelyard-task-id"]) == 32
    assert r.headers["x-modelyard-cluster"] == "demo-openai"


def test_task_ids_are_unique(demo_stack) -> None:
    ids = {httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(),
                      headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10).headers["x-modelyard-task-id"]
           for _ in range(5)}
    assert len(ids) == 5


def test_openai_sdk(demo_stack) -> None:
    client = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="demo-gpt", messages=[{"role": "user", "content": "sdk says hi"}])
    completion = raw.parse()
    assert completion.choices[0].message.content == "[demo-openai] echo: sdk says hi"
    assert raw.headers["x-modelyard-cluster"] == "demo-openai"
    assert completion.usage.prompt_tokens == 3


def test_models_list_from_config(demo_stack) -> None:
    client = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    names = {m.id for m in client.models.list()}
    assert {"demo-gpt", "demo-mini", "demo-claude", "demo-gemini", "demo-colors"} <= names


def test_models_list_only_allowed(demo_stack) -> None:
    r = httpx.get(f"{demo_stack.url}/v1/models", headers={"authorization": "Bearer sk-modelyard-demo-l3"})
    assert r.status_code == 200
    assert {m["id"] for m in r.json()["data"]} == {"demo-gpt", "demo-mini"}


def _assert_openai_error(r: httpx.Response, status: int) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"} and err["message"]
    assert "x-modelyard-task-id" in r.headers


@pytest.mark.parametrize("headers,body,status", [
    ({"authorization": f"Bearer {DEMO_KEY}"}, _chat("no-such-model"), 404),
    ({}, _chat(), 401),
    ({"authorization": "Bearer sk-wrong"}, _chat(), 401),
    ({"authorization": "sk-modelyard-demo"}, _chat(), 401),
], ids=["unknown-model", "no-key", "wrong-key", "key-without-bearer"])
def test_bad_requests(demo_stack, headers: dict, body: dict, status: int) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=body, headers=headers, timeout=10)
    if status == 401:
        assert r.status_code == 401
        assert "message" in r.json()["error"]
    else:
        _assert_openai_error(r, status)


def test_forbidden_model_looks_unknown(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat("demo-claude"),
                   headers={"authorization": "Bearer sk-modelyard-demo-l3"}, timeout=10)
    _assert_openai_error(r, 404)


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[]", b'{"model": 3}'])
def test_malformed_json_is_400(demo_stack, raw: bytes) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", content=raw,
                   headers={"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json"}, timeout=10)
    _assert_openai_error(r, 400)
    # ... and the service is still up.
    ok = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(),
                    headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10)
    assert ok.status_code == 200


def test_client_cannot_pick_cluster(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(),
                   headers={"authorization": f"Bearer {DEMO_KEY}", "x-modelyard-cluster": "demo-anthropic",
                            "x-modelyard-tenant": "someone-else"},
                   timeout=10)
    assert r.status_code == 200 and r.headers["x-modelyard-cluster"] == "demo-openai"
    # the caller's header was removed and the gateway's own choice routed the call (not only its label)
    assert r.json()["choices"][0]["message"]["content"].startswith("[demo-openai] ")


def test_unknown_path_is_404(demo_stack) -> None:
    r = httpx.get(f"{demo_stack.url}/v1/nothing-here", headers={"authorization": f"Bearer {DEMO_KEY}"})
    _assert_openai_error(r, 404)


def test_large_body_passes_and_oversize_is_413(demo_stack) -> None:
    # 6 MiB gets through Envoy's buffer to the extproc, which parses it and finds it too long
    # for any context window (a 400 that names the window, not Envoy's 413).
    big = "x " * (3 * 1024 * 1024)
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(text=big),
                   headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=60)
    assert r.status_code == 400 and "context" in r.json()["error"]["message"], r.text[:300]
    huge = b'{"model":"demo-gpt","messages":[{"role":"user","content":"' + b"y" * (33 * 1024 * 1024) + b'"}]}'
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", content=huge,
                   headers={"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json"}, timeout=60)
    _assert_openai_error(r, 413)  # Envoy's own 413, in the caller's shape
    assert "larger than the gateway accepts" in r.json()["error"]["message"]


def test_metrics_exported(demo_stack) -> None:
    httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(),
               headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10)
    text = httpx.get(f"http://{demo_stack.cfg.extproc.metrics_address}/metrics").text
    assert 'modelyard_requests_total{cluster="demo-openai",model="demo-gpt",status="200"}' in text
    assert "modelyard_request_duration_seconds_bucket" in text


def test_extproc_runs_on_uvloop(demo_stack) -> None:
    # The shipped config leaves extproc.event_loop at its default: the stack's extproc says which loop it got.
    log = (demo_stack.log_dir / "extproc.log").read_text()
    assert "event loop: uvloop" in log


def test_extproc_runs_the_build_under_test(demo_stack) -> None:
    # contracts/compiled.py: the stack's extproc inherits this process's choice (compiled where built,
    # pure with MODELYARD_PURE_PYTHON=1); `make test` names the build it runs in MODELYARD_EXPECT_BUILD.
    from contracts import compiled

    build = os.environ.get("MODELYARD_EXPECT_BUILD") or compiled.select()
    text = httpx.get(f"http://{demo_stack.cfg.extproc.metrics_address}/metrics").text
    assert f'modelyard_extproc_build_info{{build="{build}"}} 1.0' in text
    assert f"({build} build)" in (demo_stack.log_dir / "extproc.log").read_text()


def test_envoy_reaches_the_extproc_over_its_unix_socket(demo_stack) -> None:
    # The shipped config sets extproc.unix_socket: Envoy's ext_proc cluster is the socket, not loopback TCP.
    sock = demo_stack.cfg.extproc.unix_socket
    assert sock
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", json=_chat(),
                   headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=10)
    assert r.status_code == 200
    clusters = httpx.get(f"{demo_stack.admin_url()}/clusters").text
    hosts = {line.split("::")[1] for line in clusters.splitlines() if line.startswith("modelyard-extproc::")
             and "::health_flags::" in line}
    assert hosts == {sock}
    assert f"modelyard-extproc::{sock}::rq_total::" in clusters
