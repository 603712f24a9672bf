"""The webhook guardrail against a real HTTP service on loopback, driven through a Session in memory:
a signed POST of the (already redacted) prompt; allow, block, log; a service that does not answer in
time blocks with `fail: closed` and lets the call go with `fail: open` (a `fail_open` verdict)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web

from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.session import Session
from extproc.tasks.webhook import SIGNATURE_HEADER, verify
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import free_port, without_watermarks

SECRET = "guard-hook-secret"


@pytest.fixture
async def service() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    seen: list[dict[str, Any]] = []

    async def judge(request: web.Request) -> web.Response:
        body = await request.read()
        assert verify(SECRET.encode(), body, request.headers.get(SIGNATURE_HEADER))
        seen.append(orjson.loads(body))
        if request.path == "/slow":
            await asyncio.sleep(2)
        text = " ".join(m["text"] for m in seen[-1]["messages"])
        return web.json_response({"verdict": "block" if "forbidden" in text else "allow"})

    app = web.Application()
    app.router.add_post("/judge", judge)
    app.router.add_post("/slow", judge)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


def _gateway(monkeypatch: pytest.MonkeyPatch, checks: list[dict[str, Any]]) -> Gateway:
    monkeypatch.setenv("GUARD_HOOK_SECRET", SECRET)
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["guardrails"]["policies"].append({"name": "hook", "applies_to": {"tenants": ["demo"]}, "checks": checks})
    return Gateway.build(parse_config(data))


async def _reply(gw: Gateway, text: str) -> tuple[Any, Any]:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers("sk-modelyard-demo")))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": text}]})))
    ctx = s.ctx
    s.close()
    return r, ctx


async def test_allow_block_and_the_redacted_prompt(service: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    url, seen = service
    gw = _gateway(monkeypatch, [{"type": "email", "action": "redact"},
                                {"type": "webhook", "url": f"{url}/judge", "secret_env": "GUARD_HOOK_SECRET"}])
    ok, _ = await _reply(gw, "hello from ana@example.com")
    assert not ok.HasField("immediate_response")
    assert seen[-1]["messages"] == [{"role": "user", "text": "hello from [EMAIL_1]"}]  # it saw the redacted text
    assert seen[-1]["policy"] == "hook" and seen[-1]["check"] == "webhook" and seen[-1]["tenant"] == "demo"
    no, ctx = await _reply(gw, "something forbidden")
    assert no.immediate_response.status.code == 400 and b"'hook'" in no.immediate_response.body
    assert {"policy": "hook", "check": "webhook", "action": "block", "direction": "input"} in ctx.guardrail_verdicts
    await gw.close()


@pytest.mark.parametrize("fail", ["closed", "open"])
async def test_a_webhook_that_times_out(service: Any, monkeypatch: pytest.MonkeyPatch, fail: str) -> None:
    url, _ = service
    gw = _gateway(monkeypatch, [{"type": "webhook", "name": "slow", "url": f"{url}/slow", "timeout_ms": 200,
                                 "fail": fail, "secret_env": "GUARD_HOOK_SECRET"}])
    r, ctx = await _reply(gw, "anything")
    if fail == "closed":
        assert r.immediate_response.status.code == 400 and b"'slow'" in r.immediate_response.body
        assert ctx.guardrail_verdicts == [{"policy": "hook", "check": "slow", "action": "block", "direction": "input"}]
    else:
        assert not r.HasField("immediate_response")
        assert ctx.guardrail_verdicts == [{"policy": "hook", "check": "slow", "action": "fail_open",
                                           "direction": "input"}]
    await gw.close()


def test_webhook_config_is_checked() -> None:
    from contracts.config.guardrails import GuardCheck
    for bad in ({"type": "webhook"}, {"type": "webhook", "url": "ftp://x"},
                {"type": "webhook", "url": "http://x", "action": "redact"},
                {"type": "email", "url": "http://x"}):
        with pytest.raises(ValueError):
            GuardCheck.model_validate(bad)
