"""What tracing costs the extproc: CPU per request through the sans-I/O session, off and on.

    .venv/bin/python bench/bench_tracing.py [--requests N]

One non-streamed OpenAI chat request (headers, body, response headers, response body) driven
through `Session` with plain ext_proc messages, as the extproc's servicer would. "on" exports
every span over OTLP/HTTP to a receiver in another process, so the exporter thread's CPU (which
shares this process and its GIL) is in the figure; the receiver's is not. CPU is the process's
CPU time (all threads) over the requests; the last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envoy.config.core.v3 import base_pb2  # noqa: E402
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb  # noqa: E402

from bench.smoke import scaled  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from extproc.gateway import Gateway  # noqa: E402
from extproc.service import build_routes, build_tracing  # noqa: E402
from extproc.session import Session  # noqa: E402
from ratelimit import Limiter  # noqa: E402
from tests.stack_config import free_port, without_watermarks  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RECEIVER = """
import sys
from aiohttp import web
async def traces(request):
    await request.read()
    return web.Response(body=b"", content_type="application/x-protobuf")
app = web.Application()
app.router.add_post("/v1/traces", traces)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def _headers(pairs: dict[str, str], response: bool = False) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])
    h = pb.HttpHeaders(headers=hm)
    return pb.ProcessingRequest(response_headers=h) if response else pb.ProcessingRequest(request_headers=h)


def _body(body: bytes, response: bool = False) -> pb.ProcessingRequest:
    b = pb.HttpBody(body=body, end_of_stream=True)
    return pb.ProcessingRequest(response_body=b) if response else pb.ProcessingRequest(request_body=b)


MESSAGES = [
    _headers({":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json",
              "authorization": "Bearer sk-modelyard-demo"}),
    _body(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hello from the bench"}]})),
    _headers({":status": "200", "content-type": "application/json"}, response=True),
    _body(orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                     "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}), response=True),
]


def _gateway(tracing: dict[str, Any] | None) -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"].pop("metering_db", None)
    if tracing is not None:
        data["extproc"]["tracing"] = tracing
    cfg = parse_config(data)
    return Gateway.build(cfg, limiter=Limiter(cfg.ratelimit), tracing=build_tracing(cfg))


async def _run(gw: Gateway, n: int) -> float:
    """CPU microseconds per request over `n` requests (after a warm-up)."""
    routes = build_routes()

    async def one() -> None:
        s = Session(gw, routes)
        for m in MESSAGES:
            r = await s.handle(m)
            if not isinstance(r, pb.ProcessingResponse):  # not an Interim (a step that waits): a chat answers at once
                print(f"FAILED: tracing: no reply to {m.WhichOneof('request')}: {r!r}", flush=True)
                raise SystemExit(1)
            # A request the gateway answered itself (a refusal, an error) is not the path measured.
            if r.WhichOneof("response") == "immediate_response":
                print(f"FAILED: tracing: the gateway answered {r.immediate_response.status.code}: "
                      f"{r.immediate_response.body[:200]!r}", flush=True)
                raise SystemExit(1)
        s.close()

    for _ in range(scaled(200, 10)):
        await one()
    t0 = time.process_time()
    for _ in range(n):
        await one()
    if gw.tracing is not None:  # the spans of these requests are exported inside the measurement
        await asyncio.to_thread(gw.tracing.provider.force_flush)
    return (time.process_time() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=scaled(3000, 50))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    a = p.parse_args(argv)
    port = free_port()
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)])
    try:
        time.sleep(1.0)
        endpoint = f"http://127.0.0.1:{port}/v1/traces"
        cases: dict[str, dict[str, Any] | None] = {
            "off": None,
            "on, sampled": {"endpoint": endpoint, "export_delay_ms": 200},
            "on, sample_ratio 0": {"endpoint": endpoint, "sample_ratio": 0.0},  # spans made, none recorded
        }
        results: dict[str, list[float]] = {c: [] for c in cases}
        for _ in range(a.rounds):  # interleaved rounds: a noisy neighbour hits every case alike
            for case, tracing in cases.items():
                gw = _gateway(tracing)
                results[case].append(asyncio.run(_run(gw, a.requests)))
                asyncio.run(gw.close())
    finally:
        receiver.terminate()
        receiver.wait(10)
    off = statistics.median(results["off"])
    rows = []
    print(f"{'case':<22}{'CPU us/request (median of rounds)':>36}{'vs off':>10}")
    for case, runs in results.items():
        us = statistics.median(runs)
        print(f"{case:<22}{us:>36.1f}{us / off:>10.2f}")
        rows.append({"bench": "tracing", "case": case, "metric": "cpu_per_request", "value": round(us, 1),
                     "unit": "us", "ratio": round(us / off, 2)})
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
