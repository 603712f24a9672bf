"""The demo upstreams, driven by the real SDKs, and a tiny translating proxy in front of them."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator

import aiohttp
import anthropic as anthropic_sdk
import openai as openai_sdk
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from adapters import gemini, openai
from adapters.internal import StreamEnd, TextDelta, ToolCallDelta, ToolCallStart
from adapters.registry import PROTOCOLS, translate_stream
from contracts.errors import ModelyardError
from devstack.demo import anthropic_server, behaviour, gemini_server

WEATHER_TOOL = {"name": "get_weather", "description": "Weather by city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.fixture
async def anthropic_url() -> AsyncIterator[str]:
    async with TestServer(anthropic_server.make_app(require_key="ak-1"), host="127.0.0.1") as srv:
        yield str(srv.make_url("")).rstrip("/")


@pytest.fixture
async def gemini_url() -> AsyncIterator[str]:
    async with TestServer(gemini_server.make_app(require_key="gk-1"), host="127.0.0.1") as srv:
        yield str(srv.make_url("")).rstrip("/")


async def test_anthropic_demo_plain_and_stream_with_sdk(anthropic_url: str) -> None:
    client = anthropic_sdk.AsyncAnthropic(api_key="ak-1", base_url=anthropic_url)
    msgs = [{"role": "user", "content": "hello demo world"}]
    m = await client.messages.create(model="claude-x", max_tokens=50, messages=msgs, system="be brief")
    assert m.content[0].text == "[demo-anthropic] echo: hello demo world"
    assert (m.usage.input_tokens, m.usage.output_tokens) == (5, 5) and m.stop_reason == "end_turn"
    async with client.messages.stream(model="claude-x", max_tokens=50, messages=msgs) as s:
        deltas = [t async for t in s.text_stream]
        final = await s.get_final_message()
    assert len(deltas) == 5 and "".join(deltas) == "[demo-anthropic] echo: hello demo world"
    assert final.usage.output_tokens == 5
    await client.close()


async def test_a_caller_leaving_mid_stream_is_counted_not_logged_as_a_server_error(caplog) -> None:
    """wrk stopping, or a client timing out, closes a stream's connection: the demo notes it, no traceback."""
    # As the demo runs (web.run_app; TestServer would cancel the handler): its writes fail instead.
    runner = web.AppRunner(anthropic_server.make_app(chunk_delay=0.05))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        body = orjson.dumps({"model": "c", "max_tokens": 50, "stream": True,
                             "messages": [{"role": "user", "content": "a stream cut short by its caller"}]})
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()  # gone after the first bytes, with the stream's events still to come
        async with aiohttp.ClientSession() as s:
            for _ in range(100):
                async with s.get(f"http://127.0.0.1:{port}/stats") as r:
                    stats = await r.json()
                if stats["streams_abandoned"]:
                    break
                await asyncio.sleep(0.05)
        assert stats["streams_abandoned"] == 1
    finally:
        await runner.cleanup()
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text


async def test_anthropic_demo_tool_call_and_result(anthropic_url: str) -> None:
    client = anthropic_sdk.AsyncAnthropic(api_key="ak-1", base_url=anthropic_url)
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = await client.messages.create(model="c", max_tokens=50, messages=q, tools=[WEATHER_TOOL])
    assert m.stop_reason == "tool_use" and m.content[0].name == "get_weather" and m.content[0].input == {"city": "Paris"}
    async with client.messages.stream(model="c", max_tokens=50, messages=q, tools=[WEATHER_TOOL]) as s:
        final = await s.get_final_message()
    assert final.content[0].input == {"city": "Paris"}
    follow = q + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.content[0].id,
                                                "content": "sunny, 21C"}]}]
    r = await client.messages.create(model="c", max_tokens=50, messages=follow, tools=[WEATHER_TOOL])
    assert r.content[0].text == "[demo-anthropic] tool said: sunny, 21C"
    # No tools: "weather" is just echoed.
    plain = await client.messages.create(model="c", max_tokens=50, messages=q)
    assert plain.content[0].text.startswith("[demo-anthropic] echo:")
    await client.close()


async def test_anthropic_demo_auth_and_errors(anthropic_url: str) -> None:
    bad = anthropic_sdk.AsyncAnthropic(api_key="wrong", base_url=anthropic_url, max_retries=0)
    with pytest.raises(anthropic_sdk.AuthenticationError):
        await bad.messages.create(model="c", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    good = anthropic_sdk.AsyncAnthropic(api_key="ak-1", base_url=anthropic_url, max_retries=0)
    with pytest.raises(anthropic_sdk.BadRequestError):
        await good.messages.create(model="c", max_tokens=5, messages=[])
    async with aiohttp.ClientSession() as s, s.get(anthropic_url + "/health") as r:
        assert r.status == 200
    await bad.close()
    await good.close()


async def test_gemini_demo(gemini_url: str) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi there gemini"}]}]}
    async with aiohttp.ClientSession() as s:
        async with s.post(gemini_url + "/v1beta/models/g-1:generateContent", json=body,
                          headers={"x-goog-api-key": "gk-1"}) as r:
            resp = gemini.parse_response(await r.read())
        assert resp.content == "[demo-gemini] echo: hi there gemini" and resp.usage.input_tokens == 3
        async with s.post(gemini_url + "/v1beta/models/g-1:streamGenerateContent?alt=sse&key=gk-1", json=body) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            d = gemini.StreamDecoder()
            events = []
            async for chunk in r.content.iter_any():
                events += d.feed(chunk)
            events += d.close()
        assert isinstance(events[-1], StreamEnd)
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == resp.content
        tools = {**body, "contents": [{"parts": [{"text": "weather in Oslo"}]}],
                 "tools": [{"functionDeclarations": [{"name": "w"}]}]}
        async with s.post(gemini_url + "/v1beta/models/g-1:generateContent?key=gk-1", json=tools) as r:
            tr = gemini.parse_response(await r.read())
        assert tr.finish_reason == "tool_calls" and orjson.loads(tr.tool_calls[0].arguments) == {"city": "Oslo"}
        async with s.post(gemini_url + "/v1beta/models/g-1:generateContent", json=body) as r:
            assert r.status == 401 and (await r.json())["error"]["status"] == "UNAUTHENTICATED"
        async with s.post(gemini_url + "/v1beta/models/g-1:generateContent?key=gk-1", data=b"{") as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == 400


# ---- the OpenAI SDK through a minimal translating proxy (the gateway's job, minus Envoy) ----------


def _proxy_app(upstream: str, base: str, key: str) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            req = openai.parse_request(await request.read())
        except ModelyardError as e:
            return web.Response(status=e.status, body=openai.render_error(e.status, e.message, e.type))
        up = PROTOCOLS[upstream].render_request(req, upstream_model="up-" + req.model, credential=key)
        async with aiohttp.ClientSession() as s, s.post(base + up.path, data=up.body, headers=up.headers) as r:
            if r.status != 200:
                msg = PROTOCOLS[upstream].parse_error(r.status, await r.read())
                return web.Response(status=r.status, body=openai.render_error(r.status, msg),
                                    content_type="application/json")
            if not req.stream:
                resp = PROTOCOLS[upstream].parse_response(await r.read())
                return web.Response(body=openai.render_response(resp, model=req.model),
                                    content_type="application/json")
            out = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await out.prepare(request)
            tr = translate_stream(upstream, "openai", req)
            async for chunk in r.content.iter_any():
                await out.write(tr.feed(chunk))
            await out.write(tr.finish())
            return out

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    return app


@pytest.mark.parametrize("upstream", ["anthropic", "gemini"])
async def test_openai_sdk_through_translation(upstream: str) -> None:
    demo = anthropic_server if upstream == "anthropic" else gemini_server
    async with TestServer(demo.make_app(require_key="k"), host="127.0.0.1") as up, \
            TestServer(_proxy_app(upstream, str(up.make_url("")).rstrip("/"), "k"), host="127.0.0.1") as px:
        client = openai_sdk.AsyncOpenAI(api_key="x", base_url=str(px.make_url("/v1")), max_retries=0)
        msgs = [{"role": "user", "content": "ping pong"}]
        c = await client.chat.completions.create(model="m", messages=msgs)
        assert c.choices[0].message.content == f"[demo-{upstream}] echo: ping pong" and c.model == "m"
        assert c.usage.prompt_tokens == 2 and c.usage.completion_tokens == 4
        stream = await client.chat.completions.create(model="m", messages=msgs, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == f"[demo-{upstream}] echo: ping pong" and chunks[-1].usage.completion_tokens == 4
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}}]
        wq = [{"role": "user", "content": "weather in Rome"}]
        t = await client.chat.completions.create(model="m", messages=wq, tools=tools)
        call = t.choices[0].message.tool_calls[0]
        assert t.choices[0].finish_reason == "tool_calls" and orjson.loads(call.function.arguments) == {"city": "Rome"}
        ts = await client.chat.completions.create(model="m", messages=wq, tools=tools, stream=True)
        args = "".join([tc.function.arguments or "" async for ch in ts if ch.choices
                        for tc in (ch.choices[0].delta.tool_calls or [])])
        assert orjson.loads(args) == {"city": "Rome"}
        follow = wq + [t.choices[0].message.model_dump(exclude_none=True),
                       {"role": "tool", "tool_call_id": call.id, "content": "rainy"}]
        f = await client.chat.completions.create(model="m", messages=follow, tools=tools)
        assert f.choices[0].message.content == f"[demo-{upstream}] tool said: rainy"
        await client.close()


# ---- the CLI entry points ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("module", ["devstack.demo.anthropic_server", "devstack.demo.gemini_server"])
async def test_cli_serves_health(module: str) -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port), "--require-key-env", "DEMO_KEY_T"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "DEMO_KEY_T": "k"})
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):  # readiness poll, up to ~10 s
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    async with s.get(f"http://127.0.0.1:{port}/health") as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            else:
                pytest.fail("demo server did not become ready")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_stream_event_helpers_cover_tools() -> None:
    from adapters.internal import ChatRequest, Message, TextPart, ToolDef

    req = ChatRequest("m", (Message("user", (TextPart("weather in Kyiv!"),)),), tools=(ToolDef("w"),))
    resp = behaviour.demo_reply(req, "[x]")
    evs = behaviour.demo_stream_events(resp)
    assert [e.name for e in evs if isinstance(e, ToolCallStart)] == ["w"]
    assert "".join(e.arguments for e in evs if isinstance(e, ToolCallDelta)) == '{"city":"Kyiv"}'


async def test_demo_garbage_and_slow_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    from devstack.demo import adapter_server, faults, openai_server

    monkeypatch.setattr(adapter_server, "SLOW_SECONDS", 0.3)
    async with TestServer(openai_server.make_app(), host="127.0.0.1") as srv:
        url = str(srv.make_url("/v1/chat/completions"))
        async with aiohttp.ClientSession() as s:
            def body(text: str) -> dict:
                return {"model": "m", "messages": [{"role": "user", "content": text}]}

            async with s.post(url, json=body(f"please {faults.GARBAGE}")) as r:
                assert r.status == 200 and await r.read() == faults.GARBAGE_BODY
            loop = asyncio.get_running_loop()
            start = loop.time()
            async with s.post(url, json=body(f"please {faults.SLOW}")) as r:
                assert r.status == 200 and "echo" in (await r.json())["choices"][0]["message"]["content"]
            assert loop.time() - start >= 0.3
