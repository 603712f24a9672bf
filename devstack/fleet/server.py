"""The simulated model-server fleet: one `Engine` (engine.py) per port, served the way vLLM serves
(OpenAI chat and text completions, unary and streamed; vLLM's metric names at /metrics).

    python -m devstack.fleet.server --ports 8131,8132,8133,8134 [--kv-blocks 1024] [--flush-ms 200]

Every replica runs its own continuous-batching loop on the one event loop: it takes a step from
its engine, sleeps the step's simulated duration (against a running deadline, so a late wake-up
does not stretch the next step) and then wakes the callers who got tokens. A stream gets its first
token at once and the rest in chunks every `flush_ms` (a real server sends one per step; a router
sees no difference and the two cores here are spared the per-token writes).

A prompt's tokens are its characters / `chars_per_token`; its prefix-cache blocks are hashed over
the text (system and turns in order), so prompts sharing a start share cached blocks. The output
is `max_tokens` tokens (as with vLLM's `ignore_eos`). Every answer says who gave it
(`x-fleet-replica: host:port`). POST /reset empties the cache and zeroes the counters (idle only);
GET /stats gives the counters as JSON, GET /state a cheap sample of the queue and KV cache. Also
/health, /v1/models and SGLang's /get_model_info,
/get_server_info, /get_load, /flush_cache, which the Rust routers probe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from devstack.fleet.engine import Engine, EngineSpec, SimRequest, chain_hashes

MODEL = "sim-llama"
TOKEN = " t"
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)  # vLLM's


@dataclass(eq=False)
class Call:
    """A caller's handle on its request: woken on its first token and when done."""

    req: SimRequest
    submitted: float
    first: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Replica:
    def __init__(self, name: str, spec: EngineSpec, chars_per_token: int = 4, flush_ms: float = 200.0) -> None:
        self.name = name
        self.engine = Engine(spec)
        self.chars_per_token = chars_per_token
        self.flush_s = flush_ms / 1000.0
        self._calls: dict[SimRequest, Call] = {}
        self._wake = asyncio.Event()
        self.steps = 0
        self.busy_s = 0.0  # simulated time spent in steps
        self.cpu_s = 0.0  # process CPU spent stepping and waking callers (the sim's own cost)
        # Simulated time lost to a late event loop (woken past the catch-up window): a busy box's
        # noise in the fleet's own clock, which no router causes.
        self.late_s = 0.0
        self.ttfts: list[float] = []  # seconds from arrival to the first token, at the server (no network)

    # -- the batching loop ---------------------------------------------------------------------
    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if self.engine.idle:
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
            c0 = time.process_time()
            out = self.engine.step()
            self.cpu_s += time.process_time() - c0
            if out.duration_ms <= 0:  # nothing could run (the queue's head waits for room): wait for a change
                self._wake.clear()
                await self._wake.wait()
                deadline = loop.time()
                continue
            self.steps += 1
            self.busy_s += out.duration_ms / 1000.0
            target, floor = deadline + out.duration_ms / 1000.0, loop.time() - 0.05
            if floor > target:
                self.late_s += floor - target
            deadline = max(target, floor)
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            c0 = time.process_time()
            now = loop.time()
            for r in out.first:
                call = self._calls.get(r)
                if call is not None:
                    self.ttfts.append(now - call.submitted)
                    call.first.set()
            for r in out.finished:
                call = self._calls.pop(r, None)
                if call is not None:
                    call.first.set()
                    call.done.set()
            self.cpu_s += time.process_time() - c0

    def submit(self, text: str, max_tokens: int) -> Call:
        bt = self.engine.spec.block_tokens
        req = SimRequest(uuid.uuid4().hex, chain_hashes(text, bt * self.chars_per_token),
                         max(1, len(text) // self.chars_per_token), max_tokens)
        call = Call(req, asyncio.get_running_loop().time())
        self._calls[req] = call
        self.engine.submit(req)
        self._wake.set()
        return call

    def cancel(self, call: Call) -> None:
        self._calls.pop(call.req, None)
        self.engine.cancel(call.req)
        self._wake.set()

    # -- what it reports -----------------------------------------------------------------------
    def metrics(self) -> str:
        e = self.engine
        labels = f'{{engine="0",model_name="{MODEL}"}}'
        rows = [
            ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", len(e.running)),
            ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", len(e.waiting)),
            ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage),
            ("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.",
             e.preemptions),
            ("vllm:prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", e.prefix_queries),
            ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
             e.prefix_hits),
            ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", e.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
             e.generation_tokens),
        ]
        out = []
        for name, kind, help_, value in rows:
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{labels} {float(value)}"]
        name = "vllm:time_to_first_token_seconds"
        out += [f"# HELP {name} Histogram of time to first token in seconds.", f"# TYPE {name} histogram"]
        ttfts = sorted(self.ttfts)
        i = 0
        for le in TTFT_BUCKETS:
            while i < len(ttfts) and ttfts[i] <= le:
                i += 1
            out.append(f'{name}_bucket{{engine="0",le="{le}",model_name="{MODEL}"}} {float(i)}')
        out += [f'{name}_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} {float(len(ttfts))}',
                f"{name}_sum{labels} {sum(ttfts)}", f"{name}_count{labels} {float(len(ttfts))}"]
        s = e.spec
        out += ["# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
                "# TYPE vllm:cache_config_info gauge",
                f'vllm:cache_config_info{{block_size="{s.block_tokens}",enable_prefix_caching="True",'
                f'engine="0",num_gpu_blocks="{s.kv_blocks}"}} 1.0',
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f'vllm:request_success_total{{engine="0",finished_reason="length",model_name="{MODEL}"}} '
                f"{float(e.finished)}"]
        return "\n".join(out) + "\n"

    def stats(self) -> dict[str, Any]:
        e = self.engine
        return {"replica": self.name, "running": len(e.running), "waiting": len(e.waiting),
                "kv_usage": e.kv_usage, "preemptions": e.preemptions, "prefix_queries": e.prefix_queries,
                "prefix_hits": e.prefix_hits, "prompt_tokens": e.prompt_tokens,
                "generation_tokens": e.generation_tokens, "finished": e.finished, "steps": self.steps,
                "busy_s": round(self.busy_s, 3), "cpu_s": round(self.cpu_s, 4), "late_s": round(self.late_s, 3),
                "ttft_ms": [round(t * 1000, 1) for t in self.ttfts]}

    def reset(self) -> bool:
        if not self.engine.idle:
            return False
        self.engine.reset()
        self.steps, self.busy_s, self.cpu_s, self.late_s = 0, 0.0, 0.0, 0.0
        self.ttfts = []
        return True


def prompt_of(body: dict[str, Any]) -> str | None:
    """The prompt as a cache sees it: each turn's role and text in order (None: not a chat or completion)."""
    if isinstance(body.get("messages"), list):
        parts = []
        for m in body["messages"]:
            if not isinstance(m, dict):
                return None
            content = m.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            parts.append(f"<{m.get('role', '')}>{content or ''}")
        return "".join(parts)
    prompt = body.get("prompt")
    return prompt if isinstance(prompt, str) else None


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def make_app(replica: Replica) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _error(400, "body is not JSON")
        text = prompt_of(body) if isinstance(body, dict) else None
        if text is None:
            return _error(400, "want messages (chat) or prompt (completions)")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 64
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer")
        chat = "messages" in body
        # As vLLM refuses a call past max_model_len: here the KV cache, which could never admit it.
        limit, asked = replica.engine.spec.kv_tokens - 1, len(text) // replica.chars_per_token + max_tokens
        if asked > limit:
            return _error(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                               f"{asked} tokens. Please reduce the length of the messages or completion.")
        call = replica.submit(text, max_tokens)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{call.req.rid}"
        created = int(time.time())
        usage = {"prompt_tokens": call.req.prompt_tokens, "completion_tokens": max_tokens,
                 "total_tokens": call.req.prompt_tokens + max_tokens,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        try:
            if not body.get("stream"):
                await call.done.wait()
                usage["prompt_tokens_details"] = {"cached_tokens": call.req.cached_tokens}
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": TOKEN * max_tokens}
                else:
                    choice["text"] = TOKEN * max_tokens
                return web.json_response({"id": rid, "object": "chat.completion" if chat else "text_completion",
                                          "created": created, "model": body.get("model", MODEL),
                                          "choices": [choice], "usage": usage})
            resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
            await resp.prepare(request)
            obj = "chat.completion.chunk" if chat else "text_completion"

            def chunk(n: int, finish: str | None, first: bool = False) -> bytes:
                piece = TOKEN * n
                c: dict[str, Any] = {"index": 0, "finish_reason": finish}
                if chat:
                    c["delta"] = {"role": "assistant", "content": piece} if first else {"content": piece}
                else:
                    c["text"] = piece
                return b"data: " + json.dumps({"id": rid, "object": obj, "created": created,
                                               "model": body.get("model", MODEL), "choices": [c]}).encode() + b"\n\n"

            await call.first.wait()
            sent = 1  # the first token alone, as a server sends it (TTFT); the loop may be a step on
            await resp.write(chunk(sent, "length" if max_tokens == 1 else None, first=True))
            while sent < max_tokens:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(call.done.wait(), replica.flush_s)
                now = min(call.req.generated, max_tokens)
                if now > sent or call.done.is_set():
                    await resp.write(chunk(now - sent, "length" if call.done.is_set() else None))
                    sent = now
            opts = body.get("stream_options")
            if isinstance(opts, dict) and opts.get("include_usage"):
                usage["prompt_tokens_details"] = {"cached_tokens": call.req.cached_tokens}
                await resp.write(b"data: " + json.dumps({"id": rid, "object": obj, "created": created,
                                                         "model": body.get("model", MODEL), "choices": [],
                                                         "usage": usage}).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            if not call.done.is_set():
                replica.cancel(call)  # the caller went away

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=replica.metrics(), content_type="text/plain", charset="utf-8")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(replica.stats())

    async def state(_: web.Request) -> web.Response:
        e = replica.engine  # a cheap sample for traces (bench_replicas.py --trace): no TTFT list
        return web.json_response({"running": len(e.running), "waiting": len(e.waiting), "kv_usage": e.kv_usage,
                                  "busy_s": round(replica.busy_s, 3), "finished": e.finished,
                                  "preemptions": e.preemptions})

    async def reset(_: web.Request) -> web.Response:
        if not replica.reset():
            return _error(409, "calls in flight")
        return web.json_response({"reset": True})

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "fleet"}]})

    async def model_info(_: web.Request) -> web.Response:
        return web.json_response({"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True})

    async def server_info(_: web.Request) -> web.Response:
        s = replica.engine.spec
        return web.json_response({"model_path": MODEL, "max_total_num_tokens": s.kv_tokens,
                                  "page_size": s.block_tokens, "max_running_requests": s.max_running,
                                  "version": "fleet-sim"})

    async def load(_: web.Request) -> web.Response:
        e = replica.engine
        return web.json_response({"load": len(e.running) + len(e.waiting), "num_reqs": len(e.running),
                                  "num_waiting_reqs": len(e.waiting)})

    async def stamp(_: web.Request, resp: web.StreamResponse) -> None:
        resp.headers["x-fleet-replica"] = replica.name

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.on_response_prepare.append(stamp)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/generate", completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    app.router.add_get("/state", state)
    app.router.add_post("/reset", reset)
    app.router.add_post("/flush_cache", reset)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_get("/get_load", load)
    return app


async def serve(ports: list[int], spec: EngineSpec, host: str = "127.0.0.1", flush_ms: float = 200.0,
                chars_per_token: int = 4) -> None:
    runners, tasks = [], []
    for port in ports:
        replica = Replica(f"{host}:{port}", spec, chars_per_token=chars_per_token, flush_ms=flush_ms)
        runner = web.AppRunner(make_app(replica), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
        tasks.append(asyncio.create_task(replica.run()))
    print(f"fleet: {len(ports)} replicas on {host}:{','.join(map(str, ports))} "
          f"(kv {spec.kv_tokens} tokens each)", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for t in tasks:
            t.cancel()
        for r in runners:
            await r.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="simulated vLLM-like model-server fleet")
    ap.add_argument("--ports", required=True, help="comma-separated: one replica per port")
    ap.add_argument("--host", default="127.0.0.1")
    d = EngineSpec()
    ap.add_argument("--kv-blocks", type=int, default=d.kv_blocks)
    ap.add_argument("--block-tokens", type=int, default=d.block_tokens)
    ap.add_argument("--max-running", type=int, default=d.max_running)
    ap.add_argument("--prefill-budget", type=int, default=d.prefill_budget)
    ap.add_argument("--decode-base-ms", type=float, default=d.decode_base_ms)
    ap.add_argument("--decode-ms-per-seq", type=float, default=d.decode_ms_per_seq)
    ap.add_argument("--prefill-ms-per-token", type=float, default=d.prefill_ms_per_token)
    ap.add_argument("--flush-ms", type=float, default=200.0)
    ap.add_argument("--chars-per-token", type=int, default=4)
    a = ap.parse_args(argv)
    spec = EngineSpec(a.kv_blocks, a.block_tokens, a.max_running, a.prefill_budget, a.decode_base_ms,
                      a.decode_ms_per_seq, a.prefill_ms_per_token)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve([int(p) for p in a.ports.split(",")], spec, a.host, a.flush_ms, a.chars_per_token))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
