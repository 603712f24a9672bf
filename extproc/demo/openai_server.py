"""A demo OpenAI-compatible chat server: the stand-in for a model endpoint a team already runs.

Replies are deterministic and depend on the input, so a test can tell a routed request from a
canned answer: the text echoes the last user message, prefixed with the server's name.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import zlib
from typing import Any

import orjson
from aiohttp import web

from extproc.demo.faults import CUT, FAIL, fault_in


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _error(status: int, message: str, type_: str = "invalid_request_error") -> web.Response:
    body = {"error": {"message": message, "type": type_, "code": None}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def _words(messages: list[dict[str, Any]]) -> int:
    return sum(len(_text_of(m.get("content")).split()) for m in messages)


def reply_for(name: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """The demo's answer: a tool call, a tool-result summary or an echo. Pure, shared by tests."""
    last = messages[-1] if messages else {}
    if last.get("role") == "tool":
        return {"text": f"[{name}] tool said: {_text_of(last.get('content'))}"}
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
    text = _text_of(last_user.get("content"))
    if tools and "weather" in text.lower():
        fn = tools[0].get("function", {}).get("name", "tool")
        city = text.split()[-1].strip("?.!,") if text.split() else ""
        return {"tool": {"id": f"call_{zlib.crc32(text.encode()):08x}", "name": fn, "arguments": orjson.dumps({"city": city}).decode()}}
    return {"text": f"[{name}] echo: {text}"}


class DemoOpenAI:
    def __init__(self, name: str = "demo-openai", require_key: str | None = None, chunk_delay: float = 0.0):
        self.name = name
        self.require_key = require_key
        self.chunk_delay = chunk_delay
        self.requests = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, _: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "name": self.name})

    async def stats(self, _: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        if self.require_key and request.headers.get("authorization") != f"Bearer {self.require_key}":
            return _error(401, "invalid upstream key", "authentication_error")
        try:
            body = orjson.loads(await request.read())
            messages = body["messages"]
            model = body["model"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return _error(400, "body must be JSON with model and messages")
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list")
        last_user = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"), {})
        fault = fault_in(_text_of(last_user.get("content")))
        if fault == FAIL:
            return _error(500, "demo upstream failed on purpose", "server_error")
        answer = reply_for(self.name, messages, body.get("tools"))
        prompt_tokens = _words(messages)
        completion_tokens = len(answer.get("text", "").split()) or 1
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                 "total_tokens": prompt_tokens + completion_tokens}
        cid = f"chatcmpl-{self.name}-{self.requests}"
        created = int(time.time())
        if body.get("stream"):
            return await self._stream(request, cid, created, model, answer, usage,
                                      bool((body.get("stream_options") or {}).get("include_usage")),
                                      cut=fault == CUT)
        message: dict[str, Any] = {"role": "assistant", "content": answer.get("text")}
        finish = "stop"
        if "tool" in answer:
            t = answer["tool"]
            message["tool_calls"] = [{"id": t["id"], "type": "function",
                                      "function": {"name": t["name"], "arguments": t["arguments"]}}]
            finish = "tool_calls"
        out = {"id": cid, "object": "chat.completion", "created": created, "model": model,
               "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}
        return web.Response(body=orjson.dumps(out), content_type="application/json")

    async def _stream(self, request: web.Request, cid: str, created: int, model: str,
                      answer: dict[str, Any], usage: dict[str, int], include_usage: bool,
                      cut: bool = False) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)

        async def send(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> None:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)

        await send({"role": "assistant", "content": ""})
        if "tool" in answer:
            t = answer["tool"]
            await send({"tool_calls": [{"index": 0, "id": t["id"], "type": "function",
                                        "function": {"name": t["name"], "arguments": ""}}]})
            args = t["arguments"]
            for i in range(0, len(args), 8):
                await send({"tool_calls": [{"index": 0, "function": {"arguments": args[i:i + 8]}}]})
            await send({}, "tool_calls")
        else:
            words = answer["text"].split(" ")
            for i, w in enumerate(words):
                await send({"content": w if i == 0 else " " + w})
                if cut and i == len(words) // 2:
                    await resp.write_eof()  # no finish chunk, no [DONE]
                    return resp
            await send({}, "stop")
        if include_usage:
            chunk = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [], "usage": usage}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def make_app(name: str = "demo-openai", require_key: str | None = None) -> web.Application:
    return DemoOpenAI(name, require_key).app()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="demo OpenAI-compatible model server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8101)
    p.add_argument("--name", default="demo-openai")
    p.add_argument("--require-key", default=None)
    p.add_argument("--chunk-delay", type=float, default=0.0)
    a = p.parse_args(argv)
    web.run_app(DemoOpenAI(a.name, a.require_key, a.chunk_delay).app(), host=a.host, port=a.port,
                print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
