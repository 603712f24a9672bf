"""Scale from zero beyond its first shape, through a real Envoy: a reload (SIGHUP) that gives a running
deployment `scale_from_zero` applies at once (its next caller is held, the stand-in asked, the caller
served once the replica is up) and one that takes it away lets held callers go; and a KServe v2 gRPC
deployment whose readiness is the gRPC health protocol (grpc.health.v1), its warm-up `ModelReady`,
is brought up from zero while a REST caller waits."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web

from contracts.live_config import config_version
from devstack.demo import kserve_server
from devstack.demo.scaler import Scaler
from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.e2e
AUTH = {"authorization": f"Bearer {DEMO_KEY}"}


class KServeStandIn:
    """A scale webhook that starts the demo KServe gRPC server (the replica) when asked."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.calls: list[dict[str, Any]] = []
        self.server: kserve_server.RunningServer | None = None

    def app(self) -> web.Application:
        async def scale(request: web.Request) -> web.Response:
            self.calls.append(await request.json())
            if self.server is None:
                self.server = await kserve_server.start(self.port, models=["demo-text"])
            return web.json_response({"accepted": True}, status=202)

        async def stop(_: web.Application) -> None:
            if self.server is not None:
                await self.server.stop(0)

        app = web.Application()
        app.router.add_post("/scale", scale)
        app.on_cleanup.append(stop)
        return app


def _openai_model(name: str, upstream: int, webhook: str | None = None) -> dict[str, Any]:
    dep: dict[str, Any] = {"cluster": name, "protocol": "openai", "endpoints": [f"127.0.0.1:{upstream}"],
                           "health_check": {"http_path": "/health", "interval_s": 1}, "max_inflight": 2,
                           "queue": {"bound": 8, "max_wait_s": 30}}
    if webhook:
        dep["scale_from_zero"] = {"probe_s": 0.1, "webhook": webhook}
    return {"name": name, "task_types": ["chat"], "capabilities": {"context_window": 8192}, "deployments": [dep]}


def _kserve_model(upstream: int, api: int) -> dict[str, Any]:
    return {"name": "text-cold", "task_types": ["infer"], "capabilities": {"streaming": False},
            "deployments": [{"cluster": "text-cold", "protocol": "kserve-grpc", "upstream_model": "demo-text",
                             "endpoints": [f"127.0.0.1:{upstream}"],
                             "health_check": {"grpc_service": "", "interval_s": 1}, "warmup": {},
                             "max_inflight": 2, "queue": {"bound": 8, "max_wait_s": 30},
                             "scale_from_zero": {"probe_s": 0.1, "webhook": f"http://127.0.0.1:{api}/scale"}}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    up_openai, up_kserve, up_never = free_port(), free_port(), free_port()
    scaler = Scaler(up_openai, name="later-cold", start_delay_s=None)
    never = Scaler(up_never, name="never-cold", start_delay_s=600)  # never up within the tests
    kserve = KServeStandIn(up_kserve)
    with ThreadedApp(scaler.app()) as api, ThreadedApp(never.app()) as napi, ThreadedApp(kserve.app()) as kapi:
        scaler.api = api
        data = small_config()
        data["models"] += [_openai_model("later-cold", up_openai), _kserve_model(up_kserve, kapi.port),
                           _openai_model("never-cold", up_never, f"http://127.0.0.1:{napi.port}/scale")]
        data["tenants"] = [{**t, "allowed_models": ["*"]} for t in data["tenants"]]
        with start_stack(tmp_path_factory.mktemp("sfz-live"), data) as s:
            s.data, s.scaler, s.kserve = data, scaler, kserve
            s.metrics = f"http://{data['extproc']['metrics_address']}/metrics"
            yield s


def _metric(stack, name: str, **labels: str) -> float:
    text = httpx.get(stack.metrics, timeout=5).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") and all(w in ln for w in want))


def _until(cond, seconds: float = 15) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "not within the bound"
        time.sleep(0.05)


def _apply(stack, data: dict[str, Any]) -> None:
    """Write the config and SIGHUP `serve`; back once the extproc runs that version."""
    text = yaml.safe_dump(data, sort_keys=False)
    stack.config_path.write_text(text)
    os.kill(stack.child("extproc").proc.pid, signal.SIGHUP)
    version = config_version(text.encode())
    _until(lambda: _metric(stack, "modelyard_config_info", version=version) == 1)


def _chat(stack, text: str) -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/chat/completions", headers=AUTH, timeout=60,
                      json={"model": "later-cold", "messages": [{"role": "user", "content": text}]})


def test_a_reload_that_adds_scale_from_zero_holds_the_next_caller(stack) -> None:
    # Before: no scale_from_zero, no replica: the call fails at once, nobody is asked for a replica.
    assert _chat(stack, "too early").status_code in (502, 503)
    assert stack.scaler.calls == []
    data = yaml.safe_load(yaml.safe_dump(stack.data))
    dep = data["models"][-3]["deployments"][0]
    dep["scale_from_zero"] = {"probe_s": 0.1, "webhook": f"http://127.0.0.1:{stack.scaler.api.port}/scale"}
    _apply(stack, data)
    _until(lambda: _metric(stack, "modelyard_scale_ready", cluster="later-cold") == 0 and _metric(
        stack, "modelyard_queue_depth", cluster="later-cold") == 0)

    async def run() -> httpx.Response:
        call = asyncio.ensure_future(asyncio.to_thread(_chat, stack, "held after the reload"))
        deadline = time.monotonic() + 10
        while not stack.scaler.calls:  # held, and the stand-in asked: the reload applied live
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.02)
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stack.scaler.start_now(), stack.scaler.api.loop))
        return await call

    r = asyncio.run(run())
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].endswith("echo: held after the reload")
    assert [c["method"] for c in stack.scaler.calls] == ["POST"]


def test_grpc_readiness_brings_a_kserve_deployment_up_from_zero(stack) -> None:
    assert _metric(stack, "modelyard_scale_ready", cluster="text-cold") == 0
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["wake up"]}]}
    r = httpx.post(f"{stack.url}/v2/models/text-cold/infer", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"] == [1, 8]
    assert [c["cluster"] for c in stack.kserve.calls] == ["text-cold"]
    assert _metric(stack, "modelyard_scale_ready", cluster="text-cold") == 1


def test_a_reload_that_removes_scale_from_zero_lets_held_callers_go(stack) -> None:
    assert _metric(stack, "modelyard_scale_ready", cluster="never-cold") == 0
    data = yaml.safe_load(stack.config_path.read_text())

    def chat() -> httpx.Response:
        return httpx.post(f"{stack.url}/v1/chat/completions", headers=AUTH, timeout=60,
                          json={"model": "never-cold", "messages": [{"role": "user", "content": "let go"}]})

    async def run() -> httpx.Response:
        call = asyncio.ensure_future(asyncio.to_thread(chat))
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(_metric, stack, "modelyard_queue_depth", cluster="never-cold") < 1:
            assert time.monotonic() < deadline and not call.done()
            await asyncio.sleep(0.02)
        del data["models"][-1]["deployments"][0]["scale_from_zero"]
        await asyncio.to_thread(_apply, stack, data)
        return await call

    t0 = time.monotonic()
    r = asyncio.run(run())
    # Let go at the reload, not at the tier's 30 s wait: it goes upstream, where nobody listens.
    assert r.status_code in (502, 503) and time.monotonic() - t0 < 15, r.text
    assert _metric(stack, "modelyard_queue_refused_total", cluster="never-cold", reason="max_wait") == 0
