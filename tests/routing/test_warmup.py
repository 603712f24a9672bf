"""Warm-up: the request each protocol gets, the scheduler's `warming` filter (failing open when
every candidate warms), and the Warmer against a real HTTP demo upstream: start, failure retries,
and a cooldown that ends in a warm-up before traffic returns."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from aiohttp import web

from devstack.demo.openai_server import make_app
from extproc.routing import RouteRequest, Scheduler
from extproc.telemetry.warmup import Warmer, warmup_call

from .conftest import dep, make_config, model, tenant_of

NOW = 100.0


def _config(*deps: dict, routing: dict | None = None):
    return make_config([model("m", list(deps))], routing=routing)


@pytest.mark.parametrize(("protocol", "path", "needle"), [
    ("openai", "/v1/chat/completions", b'"max_completion_tokens":1'),
    ("anthropic", "/v1/messages", b'"max_tokens":1'),
    ("gemini", "/v1beta/models/up:generateContent", b'"maxOutputTokens":1'),
    # OpenAI's Responses API refuses fewer than 16 output tokens.
    ("responses", "/v1/responses", b'"max_output_tokens":16'),
])
def test_chat_warmup_is_a_one_token_completion_in_the_deployment_protocol(protocol: str, path: str,
                                                                          needle: bytes) -> None:
    cfg = _config(dep("a", monitored=False, protocol=protocol, upstream_model="up", warmup={"prompt": "hello"}))
    call = warmup_call(cfg.clusters()["a"], "m")
    assert (call.kind, call.method, call.path) == ("http", "POST", path)
    assert needle in call.body.replace(b" ", b"") and b"hello" in call.body


def test_kserve_warmup_asks_readiness() -> None:
    # A KServe model serves inference (the config refuses one that could never be routed).
    rest = make_config([model("m", [dep("r", monitored=False, protocol="kserve-rest", upstream_model="up", warmup={})],
                              task_types=["infer"])])
    call = warmup_call(rest.clusters()["r"], "m")
    assert (call.kind, call.method, call.path) == ("http", "GET", "/v2/models/up/ready")
    grpc_cfg = make_config([model("m", [dep("g", monitored=False, protocol="kserve-grpc", warmup={})],
                                  task_types=["infer"])])
    assert warmup_call(grpc_cfg.clusters()["g"], "m").kind == "grpc-ready"


def test_a_warming_deployment_is_skipped_unless_every_one_is() -> None:
    cfg = _config(dep("a", monitored=False), dep("b", monitored=False))
    s = Scheduler(cfg)
    req = RouteRequest("m", tenant_of(cfg, "t"))
    s.warming.add("a")
    d = s.decide(req, NOW, {})
    assert [c.cluster for c in d.candidates] == ["b"]
    assert any(r.cluster == "a" and r.check == "warming" for r in d.rejected)
    s.warming.add("b")
    d = s.decide(req, NOW, {})
    assert {c.cluster for c in d.candidates} == {"a", "b"} and d.fail_open == ("warming",)


async def _demo(prompts: list[str], fail_first: int = 0,
                health: dict[str, bool] | None = None) -> tuple[web.AppRunner, str]:
    """The OpenAI demo upstream, recording the prompt of every request; the first `fail_first`
    requests answer 503 (a model server still loading); `/health` answers 503 while
    `health["ok"]` is False."""
    app = make_app(name="warm")
    failures = {"left": fail_first}

    @web.middleware
    async def record(request: web.Request, handler):  # type: ignore[no-untyped-def]
        if request.path == "/health" and health is not None and not health["ok"]:
            return web.json_response({"status": "down"}, status=503)
        if request.method == "POST":
            body = orjson.loads(await request.read())
            prompts.append(body["messages"][-1]["content"])
            if failures["left"] > 0:
                failures["left"] -= 1
                return web.json_response({"error": {"message": "loading"}}, status=503)
        return await handler(request)

    app.middlewares.append(record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"127.0.0.1:{runner.addresses[0][1]}"


async def _until(cond, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


async def test_warmer_retries_until_the_endpoint_answers() -> None:
    prompts: list[str] = []
    runner, ep = await _demo(prompts, fail_first=2)
    cfg = _config(dep("a", monitored=False, endpoints=[ep], warmup={"prompt": "wake", "retry_interval_s": 0.05}))
    s = Scheduler(cfg)
    w = Warmer(cfg, s)
    try:
        w.start()
        assert s.warming == {"a"}  # marked before the first request goes out
        await _until(lambda: not s.warming)
        assert prompts == ["wake", "wake", "wake"]  # two 503s, then the answer that ends warming
    finally:
        await w.close()
        await runner.cleanup()


async def test_a_cooldown_ends_in_a_warmup_before_traffic_returns() -> None:
    prompts: list[str] = []
    runner, ep = await _demo(prompts)
    cfg = _config(dep("a", monitored=False, endpoints=[ep], warmup={"prompt": "after-cooldown"}),
                  routing={"cooldown": {"failures": 1, "window_s": 10, "cooldown_s": 0.6}})
    s = Scheduler(cfg)
    w = Warmer(cfg, s)
    try:
        w.start()
        await _until(lambda: not s.warming)
        s.record("a", 0.1, ok=False, now=time.monotonic())  # the upstream failed: cooldown starts
        await _until(lambda: "a" in s.warming)  # marked while still cooling down ...
        assert s.feedback.cooling_until("a", time.monotonic()) is not None
        await _until(lambda: not s.warming)  # ... and warmed once the cooldown is over
        assert s.feedback.cooling_until("a", time.monotonic()) is None
        assert prompts == ["after-cooldown", "after-cooldown"]
    finally:
        await w.close()
        await runner.cleanup()


async def test_an_unanswered_warmup_gives_up_and_routes_anyway() -> None:
    cfg = _config(dep("a", monitored=False, endpoints=["127.0.0.1:9"],  # nothing listens on the discard port
                      warmup={"timeout_s": 0.3, "retry_interval_s": 0.05}))
    s = Scheduler(cfg)
    w = Warmer(cfg, s)
    try:
        w.start()
        assert "a" in s.warming
        await _until(lambda: not s.warming, timeout=3)
    finally:
        await w.close()


async def test_a_deployment_back_from_unhealthy_is_warmed_before_traffic() -> None:
    prompts: list[str] = []
    health = {"ok": True}
    runner, ep = await _demo(prompts, health=health)
    cfg = _config(dep("a", monitored=False, endpoints=[ep], warmup={"prompt": "back"},
                      health_check={"http_path": "/health", "interval_s": 0.05, "unhealthy_threshold": 2}))
    s = Scheduler(cfg)
    w = Warmer(cfg, s)
    try:
        w.start()
        await _until(lambda: not s.warming)
        await asyncio.sleep(0.3)
        assert not s.warming and prompts == ["back"]  # healthy: no more warm-ups
        health["ok"] = False
        await _until(lambda: "a" in s.warming)  # out while unhealthy ...
        await asyncio.sleep(0.3)
        assert "a" in s.warming and prompts == ["back"]  # ... and nothing sent to it
        health["ok"] = True
        await _until(lambda: not s.warming)  # passes again: warmed, then routable
        assert prompts == ["back", "back"]
    finally:
        await w.close()
        await runner.cleanup()
