"""Dynamic batching: images/s and latency at 16 concurrent callers, batching on vs off, in one run.

One stack (Envoy + extproc) in front of the demo KServe server with a GPU-like cost (a fixed cost
per call plus a small cost per image, one call at a time). Two models point at it: one batches,
one does not. Each case runs for `--seconds` after a short warm-up; callers send one distinct
colour square each (PNG) and every answer is checked for its own label. Figures come from the
200s with the right label; any other status, transport error or wrong label, warm-up included,
fails the bench (`FAILED:` line, exit status 1).

    .venv/bin/python bench/bench_batching.py [--callers 16] [--seconds 6] [--fixed-ms 20] [--per-image-ms 1]
        [--client classify|grpc]

`--client grpc`: tritonclient.grpc (aio) callers on the gRPC ingress, one preprocessed image each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.outcomes import Tally, report  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.vision_stack import KEY, LABELS, classify_form, vision_stack  # noqa: E402


async def _caller(client: httpx.AsyncClient, url: str, model: str, colour: str, until: float,
                  lat: list[float], tally: Tally) -> None:
    body, ctype = classify_form(model, [colour])
    headers = {"authorization": f"Bearer {KEY}", "content-type": ctype}
    while time.perf_counter() < until:
        t0 = time.perf_counter()
        try:
            r = await client.post(f"{url}/v1/images/classify", content=body, headers=headers)
        except httpx.HTTPError as e:
            tally.add(type(e).__name__)  # a transport error is a failed request, not a slow one
            continue
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            tally.add(r.status_code)
            continue
        got = r.json()["results"][0]["labels"][0]["label"]
        if got != colour:
            tally.add("wrong label")  # a 200 with another caller's answer is not a success
            continue
        tally.add(200)
        lat.append(dt)


async def _grpc_caller(url: str, model: str, colour: str, until: float, lat: list[float], tally: Tally) -> None:
    """tritonclient.grpc (aio), its own channel: a [1, 3, 32, 32] FP32 tensor of one colour square."""
    import numpy as np
    import tritonclient.grpc.aio as triton_aio
    from tritonclient.utils import InferenceServerException

    from contracts.config import TensorInput
    from kernels import PreprocessSpec, preprocess
    from tests.vision_stack import COLOURS

    x = preprocess([np.full((32, 32, 3), COLOURS[colour], np.uint8)],
                   PreprocessSpec.from_tensor_input(TensorInput(width=32, height=32)))
    inp = triton_aio.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    outputs = [triton_aio.InferRequestedOutput("scores")]
    async with triton_aio.InferenceServerClient(url.removeprefix("http://")) as client:
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            try:
                res = await client.infer(model, [inp], outputs=outputs, headers={"authorization": f"Bearer {KEY}"},
                                         client_timeout=30)
            except InferenceServerException as e:
                tally.add(str(e.status()))
                continue
            dt = time.perf_counter() - t0
            if LABELS[int(res.as_numpy("scores").argmax())] != colour:
                tally.add("wrong label")
                continue
            tally.add(200)
            lat.append(dt)


async def run_case(url: str, model: str, callers: int, seconds: float, stats_url: str, tally: Tally,
                   warmup: float = scaled(1.0, 0.3), client_kind: str = "classify") -> dict[str, Any]:
    """Images/s and latency from the successful requests; every outcome, warm-up included, into `tally`."""
    colours = [LABELS[i % len(LABELS)] for i in range(callers)]
    limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        def one(c: str, until: float, sink: list[float]) -> Any:
            if client_kind == "grpc":
                return _grpc_caller(url, model, c, until, sink, tally)
            return _caller(client, url, model, c, until, sink, tally)

        sink: list[float] = []
        await asyncio.gather(*(one(c, time.perf_counter() + warmup, sink) for c in colours))
        lat: list[float] = []
        before = (await client.get(f"{stats_url}/stats")).raise_for_status().json()
        t0 = time.perf_counter()
        await asyncio.gather(*(one(c, t0 + seconds, lat) for c in colours))
        wall = time.perf_counter() - t0
        after = (await client.get(f"{stats_url}/stats")).raise_for_status().json()
    lat.sort()
    nan = float("nan")
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else [lat[0] if lat else nan] * 99
    return {"requests": len(lat), "errors": sum(tally.unexpected.values()), "images_per_s": len(lat) / wall,
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000,
            "upstream_calls": after["calls"] - before["calls"], "upstream_images": after["images"] - before["images"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--callers", type=int, default=16)
    p.add_argument("--seconds", type=float, default=scaled(6.0, 1.0))
    p.add_argument("--fixed-ms", type=float, default=20.0)
    p.add_argument("--per-image-ms", type=float, default=1.0)
    p.add_argument("--max-delay-ms", type=float, default=5.0)
    p.add_argument("--min-size", type=int, default=4)
    p.add_argument("--max-size", type=int, default=16)
    p.add_argument("--client", choices=("classify", "grpc"), default="classify")
    a = p.parse_args(argv)
    batching = {"enabled": True, "max_delay_ms": a.max_delay_ms, "min_size": a.min_size, "max_size": a.max_size}
    models = {"colors-batched": batching, "colors-single": None}
    demo = ["--fixed-ms", str(a.fixed_ms), "--per-image-ms", str(a.per_image_ms), "--max-concurrency", "1"]
    results: dict[str, dict[str, Any]] = {}
    tallies = {case: Tally("batching", case) for case in ("off", "on", "off-1", "on-1")}
    with tempfile.TemporaryDirectory(prefix="bench-batching-") as tmp, vision_stack(Path(tmp), models, demo) as stack:
        for case, model in (("off", "colors-single"), ("on", "colors-batched")):
            results[case] = asyncio.run(run_case(stack.url, model, a.callers, a.seconds, stack.demo_stats,
                                                 tallies[case], client_kind=a.client))
        # One caller: what the batching window costs a request when nobody else is there.
        for case, model in (("off-1", "colors-single"), ("on-1", "colors-batched")):
            results[case] = asyncio.run(run_case(stack.url, model, 1, a.seconds / 3, stack.demo_stats,
                                                 tallies[case], 0.3, a.client))
    on, off = results["on"], results["off"]
    batch_compute_ms = a.fixed_ms + a.per_image_ms * a.max_size
    print(f"demo model: {a.fixed_ms:g} ms per call + {a.per_image_ms:g} ms per image, one call at a time; "
          f"{a.callers} callers, {a.seconds:g} s per case; batching max_delay {a.max_delay_ms:g} ms, "
          f"size {a.min_size}..{a.max_size}; callers: {a.client}")
    print(f"{'case':<6}{'requests':>10}{'images/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'calls':>8}{'img/call':>9}"
          f"{'errors':>8}")
    for case in ("off", "on", "off-1", "on-1"):
        r = results[case]
        per_call = r["upstream_images"] / max(1, r["upstream_calls"])
        print(f"{case:<6}{r['requests']:>10}{r['images_per_s']:>10.1f}{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}"
              f"{r['upstream_calls']:>8}{per_call:>9.2f}{r['errors']:>8}")
    ratio = on["images_per_s"] / off["images_per_s"] if off["images_per_s"] else 0.0
    bound = a.max_delay_ms + batch_compute_ms
    print(f"throughput on/off: {ratio:.2f}x (goal >= 3x)")
    print(f"p99 on - p99 off: {on['p99_ms'] - off['p99_ms']:+.1f} ms (goal: batching adds at most max_delay + "
          f"one batch's compute = {bound:g} ms)")
    one_on, one_off = results["on-1"], results["off-1"]
    print(f"one caller: p50 on - off {one_on['p50_ms'] - one_off['p50_ms']:+.1f} ms (the {a.max_delay_ms:g} ms "
          f"window), p99 on - off {one_on['p99_ms'] - one_off['p99_ms']:+.1f} ms")
    rows = []
    for case in ("off", "on"):
        r = results[case]
        extra = {"baseline": off["images_per_s"], "ratio": round(ratio, 3)} if case == "on" else {}
        rows += [
            {"bench": "batching", "case": f"{a.client}-16c-{case}", "metric": "images_per_s",
             "value": round(r["images_per_s"], 1), "unit": "images/s", **extra},
            {"bench": "batching", "case": f"{a.client}-16c-{case}", "metric": "p50_latency",
             "value": round(r["p50_ms"], 1), "unit": "ms"},
            {"bench": "batching", "case": f"{a.client}-16c-{case}", "metric": "p99_latency",
             "value": round(r["p99_ms"], 1), "unit": "ms"},
            {"bench": "batching", "case": f"{a.client}-16c-{case}", "metric": "upstream_calls",
             "value": r["upstream_calls"], "unit": "calls"},
        ]
    for case in ("off-1", "on-1"):
        r = results[case]
        rows += [{"bench": "batching", "case": f"{a.client}-1c-{case[:-2]}", "metric": m, "value": round(r[k], 1),
                  "unit": "ms"} for m, k in (("p50_latency", "p50_ms"), ("p99_latency", "p99_ms"))]
    print("SUMMARY " + json.dumps(rows))
    return report(tallies.values())


if __name__ == "__main__":
    raise SystemExit(main())
