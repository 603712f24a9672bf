"""KServe v2 through the gateway: JSON vs binary tensors, REST vs gRPC callers, and cached metadata.

One demo KServe gRPC upstream (batching off), Envoy and the extproc; sequential tritonclient calls
with an [8, 3, 32, 32] FP32 tensor. Per case: median latency and the extproc's CPU time per
request (its /proc CPU-time delta over the requests: steadier than req/s on a shared machine).
Any call that does not succeed (a non-200, an error status from the client) fails the bench.

    .venv/bin/python bench/bench_kserve.py --requests 300
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.outcomes import Outcome, Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.vision_stack import KEY, vision_stack  # noqa: E402

AUTH = {"authorization": f"Bearer {KEY}"}




def outcome(call: Callable[[], Any]) -> Outcome:
    """200 for a tritonclient result or a 200 response; the status or error kind otherwise."""
    try:
        r = call()
    except InferenceServerException as e:
        return str(e.status())
    except httpx.HTTPError as e:
        return type(e).__name__
    return r.status_code if isinstance(r, httpx.Response) else 200


def measure(name: str, call: Callable[[], Any], n: int, extproc_pid: int, tallies: list[Tally]) -> dict[str, Any]:
    tallies.append(Tally("kserve", f"{name} warm-up"))
    for _ in range(scaled(10, 2)):
        tallies[-1].add(outcome(call))  # warm: connections, caches
    tallies.append(Tally("kserve", name))
    lat = []
    cpu0 = cpu_seconds(extproc_pid)
    for _ in range(n):
        t0 = time.perf_counter()
        tallies[-1].add(outcome(call))
        lat.append(time.perf_counter() - t0)
    cpu = cpu_seconds(extproc_pid) - cpu0
    return {"case": name, "p50_ms": round(statistics.median(lat) * 1000, 2),
            "extproc_cpu_us_per_req": round(cpu / n * 1e6)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=scaled(300, 10))
    args = ap.parse_args(argv)
    tallies: list[Tally] = []
    x = np.random.default_rng(0).random((8, 3, 32, 32), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp, vision_stack(Path(tmp), {"colors": None}) as stack:
        url = stack.url.removeprefix("http://")
        pid = stack.child("extproc").proc.pid
        http = triton_http.InferenceServerClient(url, network_timeout=30)
        grpc = triton_grpc.InferenceServerClient(url)

        def rest(binary: bool) -> Callable[[], Any]:
            def call() -> Any:
                inp = triton_http.InferInput("input", list(x.shape), "FP32")
                inp.set_data_from_numpy(x, binary_data=binary)
                out = triton_http.InferRequestedOutput("scores", binary_data=binary)
                return http.infer("colors", [inp], outputs=[out], headers=dict(AUTH))
            return call

        def grpc_call() -> Any:
            inp = triton_grpc.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            return grpc.infer("colors", [inp], headers=dict(AUTH))

        client = httpx.Client(timeout=10)
        rows = [
            measure("REST JSON -> gRPC upstream", rest(False), args.requests, pid, tallies),
            measure("REST binary -> gRPC upstream", rest(True), args.requests, pid, tallies),
            measure("gRPC -> gRPC upstream", grpc_call, args.requests, pid, tallies),
            measure("GET /v2/models/colors (probe cache, 2 s)",
                    lambda: client.get(f"{stack.url}/v2/models/colors", headers=AUTH), args.requests, pid, tallies),
        ]
    print(f"{'case':44} {'p50 ms':>8} {'extproc CPU us/req':>20}")
    for r in rows:
        print(f"{r['case']:44} {r['p50_ms']:>8} {r['extproc_cpu_us_per_req']:>20}")
    summary = [{"bench": "kserve", "case": r["case"], "metric": metric, "value": r[key], "unit": unit}
               for r in rows for metric, key, unit in (("p50_latency", "p50_ms", "ms"),
                                                       ("extproc_cpu", "extproc_cpu_us_per_req", "us/req"))]
    print("SUMMARY " + json.dumps(summary))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(main())
