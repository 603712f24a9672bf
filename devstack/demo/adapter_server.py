"""The aiohttp shell of every demo LLM upstream: one protocol's adapter parses the request and
renders the answer, `behaviour.demo_reply` decides it, `faults` can break it on purpose."""

from __future__ import annotations

import argparse
import asyncio
import functools
import hmac
import os
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

from aiohttp import web

from adapters import embeddings
from adapters.embeddings import EmbeddingResponse, EmbeddingRoute
from contracts.errors import ModelyardError
from devstack.demo.behaviour import (
    MAX_DEMO_EMBED_DIMS,
    demo_embedding,
    demo_reply,
    demo_stream_events,
    last_user_text,
)
from devstack.demo.choices import several, several_events
from devstack.demo.faults import (
    BAD_INPUT,
    CUT,
    FAIL,
    GARBAGE,
    GARBAGE_BODY,
    SLOW,
    SLOW_SECONDS,
    TRACE,
    TRACEBACK,
    fault_in,
    hold_seconds,
)
from devstack.demo.web_search import asked, searched, searched_events

# The request's model and stream flag from its path (Gemini), or (None, False).
PathInfo = Callable[[web.Request], tuple[str | None, bool] | None]


class AdapterDemo:
    def __init__(self, adapter: ModuleType, prefix: str, *, require_key: str | None = None,
                 chunk_delay: float = 0.0, explicit_cache: bool = False):
        self.adapter = adapter
        self.explicit_cache = explicit_cache  # the prompt cache answers only a request with markers
        self.prefix = prefix
        self.require_key = require_key
        self.chunk_delay = chunk_delay
        self.requests = 0
        self.paths: Counter[str] = Counter()  # calls per path (/stats): which API a gateway used upstream
        self.in_flight = 0  # reported as vllm:num_requests_running
        self.streams_abandoned = 0  # streams whose caller left before their end
        self.fake_waiting = 0.0  # vllm:num_requests_waiting, set by POST /fake-queue (a deep queue on demand)
        self.fake_kv = 0.0  # vllm:kv_cache_usage_perc
        self.metrics_off = False  # POST /fake-queue {"metrics": false}: /metrics answers 503 (readings go stale)
        self.delay_s = 0.0  # POST /fake-queue {"delay_ms": N}: every answer waits N ms first (a slow server)
        self.fail_rate = 0.0  # POST /fake-queue {"fail_rate": F}: that share of calls answers 500 (a failing server)
        self.embeds = False  # also answers embeddings (OpenAI /v1/embeddings or Gemini :embedContent)
        # Embeddings take delay_s per call, one call at a time (a device's forward pass, however many inputs).
        self._device: asyncio.Lock | None = None

    def _error(self, status: int, message: str, type_: str | None = None) -> web.Response:
        return web.Response(status=status, body=self.adapter.render_error(status, message, type_),
                            content_type="application/json")

    async def handle(self, request: web.Request, path_model: str | None = None,
                     stream_hint: bool = False) -> web.StreamResponse:
        return await self._counted(request, path_model, stream_hint, self.adapter)

    async def _in_protocol(self, adapter: ModuleType, request: web.Request) -> web.StreamResponse:
        """A call on one of `app(also=...)`'s paths, in that path's protocol."""
        return await self._counted(request, None, False, adapter)

    async def _counted(self, request: web.Request, path_model: str | None, stream_hint: bool,
                       adapter: ModuleType) -> web.StreamResponse:
        self.in_flight += 1
        try:
            return await self._handle(request, path_model, stream_hint, adapter)
        finally:
            self.in_flight -= 1

    async def _handle(self, request: web.Request, path_model: str | None, stream_hint: bool,
                      adapter: ModuleType) -> web.StreamResponse:
        self.requests += 1
        self.paths[request.path] += 1
        if self.require_key is not None:
            got = adapter.client_api_key(request.headers, request.query)
            if got is None or not hmac.compare_digest(got.encode(), self.require_key.encode()):
                return self._error(401, "invalid upstream API key", "authentication_error")
        try:
            req = adapter.parse_request(await request.read(), path_model=path_model, stream_hint=stream_hint)
        except ModelyardError as e:
            return self._error(e.status, e.message, e.type)
        text = last_user_text(req)
        if hold := hold_seconds(text) + self.delay_s:
            await asyncio.sleep(hold)
        fault = fault_in(text)
        if fault == FAIL or (self.fail_rate and random.random() < self.fail_rate):
            return self._error(500, "demo upstream failed on purpose", "api_error")
        if fault == TRACE:
            return web.Response(status=500, text=TRACEBACK, content_type="text/plain")
        if fault == SLOW:
            await asyncio.sleep(SLOW_SECONDS)
        if fault == GARBAGE:
            return web.Response(body=GARBAGE_BODY, content_type="application/json")
        resp = demo_reply(req, self.prefix, response_id=f"{self.prefix.strip('[]')}-{self.requests}",
                          explicit_cache=self.explicit_cache)
        n = req.choices  # OpenAI's `n`, Gemini's candidateCount (the other parsers read none)
        search = asked(req.native_only)  # the provider's own web search tool (its parser names it)
        if not req.stream:
            # With the request: an answer that echoes its settings (Responses) echoes them, as upstream.
            body = adapter.render_response(resp, model=req.model, request=req)
            if search:
                body = searched(body, text)
            return web.Response(body=several(body, n) if n > 1 else body, content_type="application/json")
        ctype = getattr(adapter, "STREAM_CONTENT_TYPE", "text/event-stream")  # Bedrock's is binary
        out = web.StreamResponse(headers={"content-type": ctype, "cache-control": "no-cache"})
        encoder = adapter.StreamEncoder(model=req.model, request=req)
        events = demo_stream_events(resp)
        try:
            await out.prepare(request)
            for ev in events[: len(events) // 2] if fault == CUT else events:
                data = encoder.encode([ev])
                if data and search:
                    data = searched_events(data, text)
                if data and n > 1:
                    data = several_events(data, n)
                if data:
                    await out.write(data)
                    if self.chunk_delay:
                        await asyncio.sleep(self.chunk_delay)
            await out.write_eof()  # a CUT stream ends here: no terminator
        except ConnectionResetError:  # the caller left mid-stream (a load tool stopping): nobody to answer
            self.streams_abandoned += 1
        return out

    async def embed(self, request: web.Request, route: EmbeddingRoute) -> web.Response:
        """Deterministic vectors (`behaviour.demo_embedding`); the OpenAI shape reports usage (words),
        Gemini's reports none, as the real APIs do."""
        self.requests += 1
        if self.require_key is not None:
            got = self.adapter.client_api_key(request.headers, request.query)
            if got is None or not hmac.compare_digest(got.encode(), self.require_key.encode()):
                return self._error(401, "invalid upstream API key", "authentication_error")
        try:
            req = embeddings.parse_request(route.shape, await request.read(), path_model=route.model)
        except ModelyardError as e:
            return self._error(e.status, e.message, e.type)
        if any(fault_in(t) == FAIL for t in req.inputs):
            return self._error(500, "demo upstream failed on purpose", "api_error")
        if any(BAD_INPUT in t for t in req.inputs):
            return self._error(400, "an input was refused on purpose", "invalid_request_error")
        if hold := max((hold_seconds(t) for t in req.inputs), default=0.0):
            await asyncio.sleep(hold)  # `demo-hold-MS` in an input: tests keep a gateway slot busy
        if self.delay_s:
            self._device = self._device or asyncio.Lock()
            async with self._device:
                await asyncio.sleep(self.delay_s)
        if req.dimensions is not None and req.dimensions > MAX_DEMO_EMBED_DIMS:
            return self._error(400, f"dimensions must be at most {MAX_DEMO_EMBED_DIMS}", "invalid_request_error")
        import numpy as np  # on the first embedding (behaviour.demo_embedding says why)

        vectors = np.array([demo_embedding(t, req.dimensions) for t in req.inputs], np.float32)
        words = sum(len(t.split()) for t in req.inputs)
        resp = EmbeddingResponse(req.model, vectors, words if route.shape == "openai" else None)
        return web.Response(body=embeddings.render_response(route.shape, resp, model=req.model, req=req),
                            content_type="application/json")

    def app(self, path: str, path_info: PathInfo | None = None, *,
            embeddings_path: str | None = None, also: Mapping[str, ModuleType] | None = None) -> web.Application:
        """`path` in the server's protocol; `also`: more paths, each in another adapter's protocol."""
        self.embeds = embeddings_path is not None

        async def route(request: web.Request) -> web.StreamResponse:
            found = embeddings.match_path(request.method, request.path) if self.embeds else None
            if found is not None:
                return await self.embed(request, found)
            info = path_info(request) if path_info else (None, False)
            if info is None:
                return self._error(404, f"unknown method {request.path}")
            return await self.handle(request, *info)

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok", "name": self.prefix.strip("[]")})

        async def stats(_: web.Request) -> web.Response:
            return web.json_response({"requests": self.requests, "paths": dict(self.paths),
                                      "streams_abandoned": self.streams_abandoned})

        async def metrics(_: web.Request) -> web.Response:
            """The load a vLLM server reports, under vLLM's names (the replica picker reads them)."""
            if self.metrics_off:
                return web.Response(status=503, text="metrics off")
            return web.Response(text=vllm_metrics(self.fake_waiting, self.in_flight, self.fake_kv),
                                content_type="text/plain")

        async def fake_queue(request: web.Request) -> web.Response:
            try:
                body = await request.json()
                self.fake_waiting = float(body.get("waiting", self.fake_waiting))
                self.fake_kv = float(body.get("kv", self.fake_kv))
                self.metrics_off = not bool(body.get("metrics", not self.metrics_off))
                self.delay_s = min(max(float(body.get("delay_ms", self.delay_s * 1000)), 0.0), 10_000) / 1000
                self.fail_rate = min(max(float(body.get("fail_rate", self.fail_rate)), 0.0), 1.0)
            except (ValueError, TypeError, AttributeError):
                return web.json_response({"error": "want {\"waiting\": N, \"kv\": F, \"metrics\": bool, "
                                                   "\"delay_ms\": N, \"fail_rate\": F}"}, status=400)
            return web.json_response({"waiting": self.fake_waiting, "kv": self.fake_kv,
                                      "metrics": not self.metrics_off, "delay_ms": self.delay_s * 1000,
                                      "fail_rate": self.fail_rate})

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post(path, route)
        if embeddings_path is not None and embeddings_path != path:
            app.router.add_post(embeddings_path, route)
        for other, adapter in (also or {}).items():
            app.router.add_post(other, functools.partial(self._in_protocol, adapter))
        app.router.add_get("/health", health)
        app.router.add_get("/stats", stats)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/fake-queue", fake_queue)
        return app


def vllm_metrics(waiting: float, running: int, kv: float) -> str:
    return ("# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="demo"}} {float(running)}\n'
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="demo"}} {waiting}\n'
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="demo"}} {kv}\n')


def replica_header(replica: str) -> Callable[[web.Request, web.StreamResponse], Awaitable[None]]:
    """Every answer, streams included, says which replica gave it (`x-demo-replica: host:port`),
    so tests through Envoy can tell where a call landed."""

    async def stamp(_: web.Request, resp: web.StreamResponse) -> None:
        resp.headers["x-demo-replica"] = replica

    return stamp


@dataclass(frozen=True)
class DemoSite:
    """One demo upstream, built from its command line and not yet listening."""

    app: web.Application
    host: str
    port: int


def serve(site: DemoSite) -> int:
    """Run one demo upstream in this process until SIGTERM or SIGINT (devstack.demo.host runs several)."""
    web.run_app(site.app, host=site.host, port=site.port, print=None, access_log=None)
    return 0


def parse(argv: list[str] | None, *, description: str, default_port: int, default_name: str,
          make_app: Callable[..., web.Application]) -> DemoSite:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=default_port)
    p.add_argument("--name", default=default_name, help="the reply prefix: tells which upstream answered")
    # The key comes from the environment, never the command line: `ps` shows every argv to every user.
    p.add_argument("--require-key-env", default=None, metavar="VAR",
                   help="answer 401 unless the client sends the key held in environment variable VAR")
    p.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    a = p.parse_args(argv)
    require_key = None
    if a.require_key_env:
        require_key = os.environ.get(a.require_key_env)
        if not require_key:
            p.error(f"--require-key-env {a.require_key_env}: the variable is not set")
    app = make_app(name=a.name, require_key=require_key, chunk_delay=a.chunk_delay)
    app.on_response_prepare.append(replica_header(f"{a.host}:{a.port}"))
    return DemoSite(app, a.host, a.port)
