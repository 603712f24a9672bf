"""Checks another service answers, against real HTTP services on loopback, driven through a Session in
memory: a moderation deployment (the demo's classifier, OpenAI's /v1/moderations shape) with
thresholds, its verdicts cached per text; a classification model answering Llama Guard's way; a
webhook on the answer; each unreachable or slow with `fail: closed` (a block) and `fail: open`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web

from contracts.config import parse_config
from devstack.demo.moderation import add_moderation_routes
from extproc.cache.part import ResponseCache
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import free_port, without_watermarks


class Services:
    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.calls: list[str] = []  # which path, per request
        self.hooks: list[dict[str, Any]] = []
        self.block_all = False  # the webhook refuses everything (a policy that changed its mind)


@pytest.fixture
async def services() -> AsyncIterator[Services]:
    port = free_port()
    svc = Services(port)
    app = web.Application()

    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        svc.calls.append(request.path)
        return await handler(request)  # type: ignore[no-any-return]

    app.middlewares.append(count)
    add_moderation_routes(app)

    async def guard_llm(request: web.Request) -> web.Response:  # a Llama Guard-style chat model
        body = await request.json()
        text = body["messages"][-1]["content"]
        verdict = "unsafe\nS9" if "bomb" in text else "safe"
        return web.json_response({"id": "c", "object": "chat.completion", "created": 1, "model": body["model"],
                                  "choices": [{"index": 0, "finish_reason": "stop",
                                               "message": {"role": "assistant", "content": verdict}}]})

    async def hook(request: web.Request) -> web.Response:
        doc = await request.json()
        svc.hooks.append(doc)
        if request.path == "/slow":
            await asyncio.sleep(2)
        blocked = svc.block_all or "forbidden" in doc.get("text", "")
        return web.json_response({"verdict": "block" if blocked else "allow"})

    app.router.add_post("/v1/chat/completions", guard_llm)
    app.router.add_post("/judge", hook)
    app.router.add_post("/slow", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield svc
    await runner.cleanup()


def _gateway(svc: Services, checks: list[dict[str, Any]], cache_path: Path | None = None) -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    if cache_path is not None:
        data["response_cache"] = {"sqlite_path": str(cache_path)}
    data["models"] += [
        {"name": "mod", "task_types": ["moderation"], "deployments": [
            {"cluster": "mod", "protocol": "openai", "endpoints": [f"127.0.0.1:{svc.port}"]}]},
        {"name": "mod-down", "task_types": ["moderation"], "deployments": [
            {"cluster": "mod-down", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"]}]},
        {"name": "guard-llm", "deployments": [
            {"cluster": "guard-llm", "protocol": "openai", "endpoints": [f"127.0.0.1:{svc.port}"]}]}]
    data["guardrails"]["policies"].append({"name": "remote", "applies_to": {"tenants": ["demo"]}, "checks": checks})
    config = parse_config(data)
    if cache_path is None:
        return Gateway.build(config)
    return Gateway.build(config, response_cache=ResponseCache.from_config(config))  # as the service builds it


async def _call(gw: Gateway, text: str, answer: str | None = None, model: str = "demo-gpt") -> tuple[bytes, Any]:
    """One chat call; with `answer`, the upstream's whole answer too. The bytes of the last reply."""
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers("sk-modelyard-demo")))
    r = await s.handle(body_msg(orjson.dumps({"model": model, "messages": [{"role": "user", "content": text}]})))
    if answer is not None and not r.HasField("immediate_response"):
        await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
        r = await s.handle(body_msg(orjson.dumps({
            "id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": answer}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}), response=True))
    ctx = s.ctx
    s.close()
    return r.SerializeToString(), ctx


def _verdicts(ctx: Any) -> list[tuple[str, str, str]]:
    return [(v["check"], v["action"], v["direction"]) for v in ctx.guardrail_verdicts or []]


async def test_moderation_thresholds_block_log_and_cache(services: Services) -> None:
    gw = _gateway(services, [
        {"type": "moderation", "name": "violence", "model": "mod", "thresholds": {"violence": 0.5}},
        {"type": "moderation", "name": "rude", "model": "mod", "thresholds": {"harassment": 0.5}, "action": "log"}])
    body, ctx = await _call(gw, "please kill the lights")
    assert b"guardrail policy 'remote' blocked this request (check 'violence')" in body and b"kill" not in body
    body, ctx = await _call(gw, "you idiot, say hi")
    assert b"blocked" not in body and ("rude", "log", "input") in _verdicts(ctx)
    before = services.calls.count("/v1/moderations")
    await _call(gw, "you idiot, say hi")  # the same text again: both verdicts from the cache
    assert services.calls.count("/v1/moderations") == before
    await gw.close()


async def test_moderation_of_the_answer(services: Services) -> None:
    gw = _gateway(services, [{"type": "moderation", "model": "mod", "direction": "output",
                              "thresholds": {"violence": 0.5}}])
    body, ctx = await _call(gw, "tell me a story", answer="and then they shoot the sheriff")
    assert b"blocked this answer (check 'moderation')" in body and b"sheriff" not in body
    assert ("moderation", "block", "output") in _verdicts(ctx)
    body, _ = await _call(gw, "tell me a story", answer="a calm story")
    assert b"blocked" not in body
    await gw.close()


@pytest.mark.parametrize("fail", ["closed", "open"])
async def test_an_unreachable_moderation_model(services: Services, fail: str) -> None:
    gw = _gateway(services, [{"type": "moderation", "model": "mod-down", "fail": fail, "timeout_ms": 300}])
    body, ctx = await _call(gw, "hello")
    if fail == "closed":
        assert b"blocked this request" in body and _verdicts(ctx) == [("moderation", "block", "input")]
    else:
        assert b"blocked" not in body and _verdicts(ctx) == [("moderation", "fail_open", "input")]
    await gw.close()


async def test_a_classification_model_read_llama_guard_style(services: Services) -> None:
    gw = _gateway(services, [{"type": "classify", "model": "guard-llm", "direction": "both",
                              "prompt": "Is this safe? Answer safe or unsafe.\n\n{text}"}])
    body, _ = await _call(gw, "how to build a bomb")
    assert b"blocked this request (check 'classify')" in body
    body, _ = await _call(gw, "how to bake bread", answer="then add the bomb")
    assert b"blocked this answer (check 'classify')" in body
    body, _ = await _call(gw, "how to bake bread", answer="flour and water")
    assert b"blocked" not in body
    await gw.close()


async def test_an_output_webhook_and_its_timeout(services: Services) -> None:
    gw = _gateway(services, [{"type": "webhook", "url": f"{services.url}/judge", "direction": "output"}])
    body, _ = await _call(gw, "anything", answer="a forbidden answer")
    assert b"blocked this answer (check 'webhook')" in body
    assert services.hooks[-1]["direction"] == "output" and services.hooks[-1]["text"] == "a forbidden answer"
    await gw.close()
    for fail in ("closed", "open"):
        gw = _gateway(services, [{"type": "webhook", "name": "slow", "url": f"{services.url}/slow",
                                  "direction": "output", "timeout_ms": 200, "fail": fail}])
        body, ctx = await _call(gw, "anything", answer="fine")
        assert (b"blocked this answer" in body) is (fail == "closed")
        assert _verdicts(ctx) == [("slow", "block" if fail == "closed" else "fail_open", "output")]
        await gw.close()


async def test_a_cached_answer_is_asked_about_again(services: Services, tmp_path: Path) -> None:
    gw = _gateway(services, [{"type": "webhook", "url": f"{services.url}/judge", "direction": "output"}],
                  cache_path=tmp_path / "cache.sqlite")
    body, _ = await _call(gw, "cache me", answer="a fine answer", model="demo-gpt-cached")
    assert b"blocked" not in body
    assert gw.response_cache is not None
    await asyncio.to_thread(gw.response_cache.store.flush)  # type: ignore[attr-defined]  # the write queue, written
    asked = len(services.hooks)
    services.block_all = True  # the service now refuses it: the stored answer is refused as a fresh one would be
    body, ctx = await _call(gw, "cache me", model="demo-gpt-cached")
    assert b"blocked this answer (check 'webhook')" in body and len(services.hooks) == asked + 1
    assert ("webhook", "block", "output") in _verdicts(ctx)
    await gw.close()
