"""Text batched across callers (docs/batching.md "Embeddings", "KServe text tensors"): throughput and
upstream calls per request with batching on against off, and the latency batching adds at low load.

One stack through Envoy, two models on two demo OpenAI upstreams of the same kind: `embed-batched`
(the shipped demo's batching: max_delay_ms 5, min_size 8, max_size 32) and `embed-alone` (none).
Each upstream takes `CALL_MS` per call, one call at a time, however many inputs it holds (a device's
forward pass: devstack/demo/adapter_server.py). Per round, each model in turn: `CALLERS` closed-loop
callers with one text each for `SECONDS`; then one caller alone, `LOW_CALLS` pairs of calls (batched,
then unbatched, so both see the same box; the added latency is the median of the pairs' differences). Upstream calls
are counted at each demo (`/stats`). Every answer is checked to be the caller's own vector. The same
for KServe v2 text tensors (REST JSON, one BYTES text per call) on the demo KServe server's text
model (`CALL_MS` a call, one at a time): `text-batched` against `text-alone`; the same models called by
tritonclient.grpc.aio callers only (`grpc-*`: a batch with no REST caller, its merged call made by the
extproc itself); and REST callers to the same text model behind the demo's v2 REST front
(`rest-batched` against `rest-alone`, `kserve-rest` deployments: the extproc makes the merged call).
Medians over rounds; the box is shared, so only the ratios in one run mean anything.
"""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from devstack.child import Child  # noqa: E402
from devstack.demo.behaviour import demo_embedding  # noqa: E402
from tests.stack_config import free_port, small_config, start_stack  # noqa: E402

KEY = "sk-modelyard-demo"
CALLERS = scaled(16, 8)
SECONDS = scaled(5.0, 1.0)
ROUNDS = scaled(3, 1)
LOW_CALLS = scaled(40, 5)
CALL_MS = 5  # the upstream's cost per call
BATCHING = {"max_delay_ms": 5, "min_size": 8, "max_size": 32}  # as the shipped demo-embed-batched
MODELS = ("embed-batched", "embed-alone", "text-batched", "text-alone", "rest-batched", "rest-alone")
# Each case: the model it calls and how (gRPC callers reuse the KServe gRPC text models).
CASES = {**{m: m for m in MODELS}, "grpc-batched": "text-batched", "grpc-alone": "text-alone"}
LOW_ONLY = "--low-only" in sys.argv  # only the one-caller pairs: the latency batching adds at low load


def _model(name: str, port: int, batching: dict | None) -> dict:
    m = {"name": name, "task_types": ["embedding"], "capabilities": {"context_window": 8192, "streaming": False},
         "deployments": [{"cluster": f"demo-{name}", "protocol": "openai", "endpoints": [f"127.0.0.1:{port}"]}]}
    if batching:
        m["batching"] = batching
    return m


def _text_model(name: str, port: int, batching: dict | None, protocol: str = "kserve-grpc") -> dict:
    m = {"name": name, "task_types": ["infer"], "capabilities": {"streaming": False},
         "deployments": [{"cluster": f"kserve-{name}", "protocol": protocol, "upstream_model": "demo-text",
                          "endpoints": [f"127.0.0.1:{port}"]}]}
    if batching:
        m["batching"] = batching
    return m


class Failed(Exception):
    pass


async def _grpc_call(client: object, model: str, text: str, check: bool) -> float:
    import tritonclient.grpc.aio as triton_aio

    inp = triton_aio.InferInput("text", [1], "BYTES")
    inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    t0 = time.monotonic()
    try:
        res = await client.infer(model, [inp], headers={"authorization": f"Bearer {KEY}"})  # type: ignore[attr-defined]
    except Exception as e:  # tritonclient's InferenceServerException: the caller's error
        raise Failed(f"{model} (gRPC): {e}") from None
    dt = time.monotonic() - t0
    if check and not np.array_equal(res.as_numpy("embedding")[0], np.asarray(demo_embedding(text, 8), np.float32)):
        raise Failed(f"{model} (gRPC): a caller got a vector that is not its own")
    return dt


async def _call(http: httpx.AsyncClient, url: str, model: str, text: str, check: bool) -> float:
    t0 = time.monotonic()
    if not model.startswith("embed-"):
        r = await http.post(f"{url}/v2/models/{model}/infer", json={
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": [text]}]})
    else:
        r = await http.post(f"{url}/v1/embeddings", json={"model": model, "input": text, "encoding_format": "base64"})
    dt = time.monotonic() - t0
    if r.status_code != 200:
        raise Failed(f"{model}: {r.status_code} {r.text[:200]}")
    if check:
        if not model.startswith("embed-"):
            got = np.asarray(r.json()["outputs"][0]["data"], np.float32)
            want = np.asarray(demo_embedding(text, 8), np.float32)
        else:
            got = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
            want = np.asarray(demo_embedding(text, None), np.float32)
        if not np.array_equal(got, want):
            raise Failed(f"{model}: a caller got a vector that is not its own")
    return dt


async def _load(url: str, case: str, callers: int, seconds: float) -> tuple[int, list[float]]:
    """Closed loop: `callers` callers, each one distinct text per call, for `seconds`."""
    lat: list[float] = []
    stop = time.monotonic() + seconds
    model = CASES[case]
    if case.startswith("grpc-"):
        import tritonclient.grpc.aio as triton_aio

        async def grpc_caller(c: int) -> None:
            client = triton_aio.InferenceServerClient(url.removeprefix("http://"))
            try:
                n = 0
                while time.monotonic() < stop:
                    lat.append(await _grpc_call(client, model, f"caller {c} text {n}", check=n % 8 == 0))
                    n += 1
            finally:
                await client.close()
        await asyncio.gather(*(grpc_caller(c) for c in range(callers)))
        return len(lat), lat
    limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
    async with httpx.AsyncClient(timeout=30, limits=limits, headers={"authorization": f"Bearer {KEY}"}) as http:
        async def caller(c: int) -> None:
            n = 0
            while time.monotonic() < stop:
                lat.append(await _call(http, url, model, f"caller {c} text {n}", check=n % 8 == 0))
                n += 1
        await asyncio.gather(*(caller(c) for c in range(callers)))
    return len(lat), lat


async def _paired(url: str, batched: str, alone: str, calls: int) -> list[tuple[float, float]]:
    """One caller: a call to each model in turn, `calls` times: (batched, unbatched) latencies."""
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {KEY}"}) as http:
        return [(await _call(http, url, batched, f"lone text {i}", check=True),
                 await _call(http, url, alone, f"lone text {i}", check=True)) for i in range(calls)]


async def _low(url: str, model: str, calls: int) -> list[float]:
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {KEY}"}) as http:
        return [await _call(http, url, model, f"lone text {i}", check=True) for i in range(calls)]


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> int:
    work = scratch.folder("bench-embed-batch-")
    ports = {"embed-batched": free_port(), "embed-alone": free_port()}
    kserve = {n: (free_port(), free_port()) for n in MODELS[2:]}
    data = small_config()
    data["models"] += [_model(n, ports[n], BATCHING if n == "embed-batched" else None) for n in MODELS[:2]]
    # The rest-* models reach their demo's v2 REST front (its stats port) as kserve-rest deployments.
    data["models"] += [_text_model(n, kserve[n][1] if n.startswith("rest-") else kserve[n][0],
                                   BATCHING if n.endswith("-batched") else None,
                                   "kserve-rest" if n.startswith("rest-") else "kserve-grpc") for n in MODELS[2:]]
    data["tenants"] = [{**t, "allowed_models": ["*"]} for t in data["tenants"]]
    res: dict[str, dict[str, list[float]]] = {n: {"rps": [], "calls": [], "p50": [], "p99": [], "low": [],
                                                                  "added": []}
                                              for n in CASES}
    stack = start_stack(work, data)
    for n, (port, stats) in kserve.items():  # one demo KServe server per model: calls counted apart
        argv = [sys.executable, "-m", "devstack.demo.kserve_server", "--port", str(port), "--stats-port", str(stats),
                "--fixed-ms", str(CALL_MS), "--max-concurrency", "1"]
        stack.children.insert(0, Child(f"kserve-{n}", argv, ("http", f"http://127.0.0.1:{stats}/stats")))

    def upstream_calls(n: str) -> int:
        n = CASES[n]
        if n in kserve:
            return int(httpx.get(f"http://127.0.0.1:{kserve[n][1]}/stats", timeout=5).json()["calls"])
        return int(httpx.get(f"http://127.0.0.1:{ports[n]}/stats", timeout=5).json()["requests"])

    with stack:
        url = stack.url
        for n in MODELS[:2]:
            httpx.post(f"http://127.0.0.1:{ports[n]}/fake-queue", json={"delay_ms": CALL_MS}, timeout=5)
        try:
            for n in MODELS:  # warm every path once
                asyncio.run(_low(url, n, 2))
            for _ in range(ROUNDS):
                for n in CASES if not LOW_ONLY else ():
                    before = upstream_calls(n)
                    t0 = time.monotonic()
                    count, lat = asyncio.run(_load(url, n, CALLERS, SECONDS))
                    wall = time.monotonic() - t0
                    calls = upstream_calls(n) - before
                    r = res[n]
                    r["rps"].append(count / wall)
                    r["calls"].append(calls / count)
                    r["p50"].append(_pct(lat, 0.5) * 1000)
                    r["p99"].append(_pct(lat, 0.99) * 1000)
                # One caller alone: batched and unbatched calls in turn, so both see the same box.
                for b_, a_ in (("embed-batched", "embed-alone"), ("text-batched", "text-alone")):
                    pairs = asyncio.run(_paired(url, b_, a_, LOW_CALLS))
                    res[b_]["low"].append(statistics.median(p[0] for p in pairs) * 1000)
                    res[a_]["low"].append(statistics.median(p[1] for p in pairs) * 1000)
                    res[b_]["added"].append(statistics.median(p[0] - p[1] for p in pairs) * 1000)
        except Failed as e:
            print(f"FAILED: {e}", flush=True)
            return 1
    med = {n: {k: statistics.median(v) for k, v in res[n].items() if v} for n in CASES}
    if LOW_ONLY:
        for b_, a_ in (("embed-batched", "embed-alone"), ("text-batched", "text-alone")):
            print(f"{b_:14s} one caller {med[b_]['low']:.2f} ms, unbatched {med[a_]['low']:.2f} ms, "
                  f"added {med[b_]['added']:+.2f} ms (rounds: {', '.join(f'{x:+.2f}' for x in res[b_]['added'])})")
        print(f"({ROUNDS} rounds of {LOW_CALLS} pairs; window {BATCHING['max_delay_ms']} ms; the box is shared)")
        return 0
    rows = []
    for kind, (b, a) in {"embeddings": (med["embed-batched"], med["embed-alone"]),
                         "kserve text": (med["text-batched"], med["text-alone"]),
                         "kserve text, grpc callers": (med["grpc-batched"], med["grpc-alone"]),
                         "kserve rest text": (med["rest-batched"], med["rest-alone"])}.items():
        rows += [
            {"bench": "text", "case": f"{kind}: batched, {CALLERS} callers", "metric": "req/s",
             "value": round(b["rps"], 1), "unit": "req/s"},
            {"bench": "text", "case": f"{kind}: unbatched, {CALLERS} callers", "metric": "req/s",
             "value": round(a["rps"], 1), "unit": "req/s"},
            {"bench": "text", "case": f"{kind}: throughput batched / unbatched", "metric": "ratio",
             "value": round(b["rps"] / a["rps"], 2), "unit": "x"},
            {"bench": "text", "case": f"{kind}: upstream calls per request, batched",
             "metric": "median", "value": round(b["calls"], 3), "unit": "calls"},
            {"bench": "text", "case": f"{kind}: upstream calls per request, unbatched",
             "metric": "median", "value": round(a["calls"], 3), "unit": "calls"},
            {"bench": "text", "case": f"{kind}: p99 batched / unbatched under load", "metric": "ratio",
             "value": round(b["p99"] / a["p99"], 2), "unit": "x"},
        ]
        if "added" in b:
            rows.append({"bench": "text", "case": f"{kind}: one caller, latency added by batching",
                         "metric": "median", "value": round(b["added"], 2), "unit": "ms"})
    for n in CASES:
        m = med[n]
        low = f"  one caller {m['low']:.2f} ms" if "low" in m else ""
        print(f"{n:14s} {m['rps']:8.1f} req/s  {m['calls']:.3f} upstream calls/req  p50 {m['p50']:.1f} ms  "
              f"p99 {m['p99']:.1f} ms{low}")
    print(f"({ROUNDS} rounds of {SECONDS:g} s, {CALLERS} callers, upstream {CALL_MS} ms a call; "
          f"window {BATCHING['max_delay_ms']} ms; the box is shared)")
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
