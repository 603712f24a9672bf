"""Deterministic Anthropic Messages demo upstream (aiohttp).

    python -m extproc.demo.anthropic_server --port 8102 [--require-key KEY]

Behaviour (shared with the other demo upstreams through `demo_reply`):
- the reply is "<prefix> echo: <text of the last user message>";
- with tools, a last user message containing "weather" gets a call to the first tool with
  arguments {"city": <last word of the message, punctuation stripped>};
- a last message carrying a tool result gets "<prefix> tool said: <result content>";
- usage: input tokens = words in system prompt + all message texts, output tokens = words in
  the reply (for a tool call: words in its arguments JSON);
- streams send one text event per word (and tool arguments in two fragments).
"""

from __future__ import annotations

import argparse
import hmac
import itertools

import orjson
from aiohttp import web

from adapters import anthropic
from adapters.errors import AdapterError
from adapters.internal import (
    ChatRequest, ChatResponse, StreamEnd, StreamEvent, StreamFinish, StreamStart, TextDelta, ToolCall,
    ToolCallDelta, ToolCallStart, Usage, UsageUpdate, message_text,
)

from extproc.demo.faults import CUT, FAIL, fault_in

PREFIX = "[demo-anthropic]"
_PUNCT = ".,!?;:\"'()[]{}"


def demo_reply(req: ChatRequest, prefix: str, *, response_id: str = "demo-0") -> ChatResponse:
    """The deterministic answer every demo upstream gives to `req`."""
    words_in = len(req.system.split()) if req.system else 0
    for m in req.messages:
        words_in += len(message_text(m).split())
    last = req.messages[-1]
    if last.role == "tool":
        text = f"{prefix} tool said: {message_text(last)}"
    else:
        user_text = next((message_text(m) for m in reversed(req.messages) if m.role == "user"), "")
        if last.role == "user" and req.tools and "weather" in user_text.lower():
            words = user_text.split()
            city = words[-1].strip(_PUNCT) if words else ""
            args = orjson.dumps({"city": city}).decode()
            call = ToolCall("call_0", req.tools[0].name, args)
            return ChatResponse(response_id, req.model, "", (call,), "tool_calls", Usage(words_in, len(args.split())))
        text = f"{prefix} echo: {user_text}"
    return ChatResponse(response_id, req.model, text, (), "stop", Usage(words_in, len(text.split())))


def demo_stream_events(resp: ChatResponse) -> list[StreamEvent]:
    """The reply cut into stream events: one text delta per word, tool arguments in two parts."""
    events: list[StreamEvent] = [UsageUpdate(resp.usage.input_tokens, 0), StreamStart(resp.id, resp.model)]
    words = resp.content.split(" ") if resp.content else []
    for i, w in enumerate(words):
        events.append(TextDelta(w if i == len(words) - 1 else w + " "))
    for n, tc in enumerate(resp.tool_calls):
        events.append(ToolCallStart(n, tc.id, tc.name))
        half = len(tc.arguments) // 2
        events.append(ToolCallDelta(n, tc.arguments[:half]))
        events.append(ToolCallDelta(n, tc.arguments[half:]))
    events += [StreamFinish(resp.finish_reason), UsageUpdate(resp.usage.input_tokens, resp.usage.output_tokens),
               StreamEnd()]
    return events

REQUIRE_KEY = web.AppKey("require_key", object)
_COUNTER = web.AppKey("counter", itertools.count)


def _error(status: int, message: str, type: str | None = None) -> web.Response:
    return web.Response(status=status, body=anthropic.render_error(status, message, type),
                        content_type="application/json")


async def _messages(request: web.Request) -> web.StreamResponse:
    key = request.app[REQUIRE_KEY]
    if key is not None:
        got = anthropic.client_api_key(request.headers, request.query)
        if got is None or not hmac.compare_digest(got.encode(), key.encode()):
            return _error(401, "invalid x-api-key", "authentication_error")
    try:
        req = anthropic.parse_request(await request.read())
    except AdapterError as e:
        return _error(e.status, e.message, e.type)
    n = next(request.app[_COUNTER])
    fault = fault_in(next((message_text(m) for m in reversed(req.messages) if m.role == "user"), ""))
    if fault == FAIL:
        return _error(500, "demo upstream failed on purpose", "api_error")
    resp = demo_reply(req, PREFIX, response_id=f"msg_demo_{n}")
    if not req.stream:
        return web.Response(body=anthropic.render_response(resp, model=req.model), content_type="application/json")
    out = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await out.prepare(request)
    enc = anthropic.StreamEncoder(model=req.model, request=req)
    events = demo_stream_events(resp)
    for ev in events[: len(events) // 2] if fault == CUT else events:
        data = enc.encode([ev])
        if data:
            await out.write(data)
    await out.write_eof()
    return out


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(require_key: str | None = None) -> web.Application:
    app = web.Application()
    app[REQUIRE_KEY] = require_key
    app[_COUNTER] = itertools.count(1)
    app.router.add_post("/v1/messages", _messages)
    app.router.add_get("/health", _health)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8102)
    ap.add_argument("--require-key", default=None, help="answer 401 unless the client sends this key")
    args = ap.parse_args(argv)
    web.run_app(make_app(args.require_key), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
