"""Deterministic Gemini generateContent demo upstream (aiohttp).

    python -m extproc.demo.gemini_server --port 8103 [--require-key KEY]

Same behaviour as the other demo upstreams (see `extproc.demo.anthropic_server.demo_reply`), with
the "[demo-gemini]" prefix. Streaming is served for `:streamGenerateContent?alt=sse`.
"""

from __future__ import annotations

import argparse
import hmac
import itertools

from aiohttp import web

from adapters import gemini
from adapters.errors import AdapterError
from adapters.registry import detect_client_protocol
from extproc.demo.anthropic_server import demo_reply, demo_stream_events

PREFIX = "[demo-gemini]"

REQUIRE_KEY = web.AppKey("require_key", object)
_COUNTER = web.AppKey("counter", itertools.count)


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=gemini.render_error(status, message), content_type="application/json")


async def _generate(request: web.Request) -> web.StreamResponse:
    key = request.app[REQUIRE_KEY]
    if key is not None:
        got = gemini.client_api_key(request.headers, request.query)
        if got is None or not hmac.compare_digest(got.encode(), key.encode()):
            return _error(401, "API key not valid. Please pass a valid API key.")
    route = detect_client_protocol("POST", request.path)
    if route is None or route.protocol != "gemini":
        return _error(404, f"unknown method {request.path}")
    if route.stream and request.query.get("alt") != "sse":
        return _error(400, "the demo serves streams only with ?alt=sse")
    try:
        req = gemini.parse_request(await request.read(), path_model=route.model, stream_hint=route.stream)
    except AdapterError as e:
        return _error(e.status, e.message)
    n = next(request.app[_COUNTER])
    resp = demo_reply(req, PREFIX, response_id=f"demo-gemini-{n}")
    if not req.stream:
        return web.Response(body=gemini.render_response(resp, model=req.model), content_type="application/json")
    out = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await out.prepare(request)
    enc = gemini.StreamEncoder(model=req.model, request=req)
    for ev in demo_stream_events(resp):
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
    app.router.add_post("/v1beta/models/{tail}", _generate)
    app.router.add_get("/health", _health)
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8103)
    ap.add_argument("--require-key", default=None, help="answer 401 unless the client sends this key")
    args = ap.parse_args(argv)
    web.run_app(make_app(args.require_key), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
