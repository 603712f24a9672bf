"""What a response-cache hit costs against a miss, through a real Envoy and extproc.

    .venv/bin/python bench/bench_cache.py [--requests N] [--rounds R]

One stack (the demo OpenAI upstream, a model with `cache: {mode: exact}` and one without),
one caller (httpx, keep-alive, sequential). Cases: `hit` (the same call again and again: answered
from the request-body step), `miss` (a new prompt each call on the cached model: lookup, upstream,
store), `uncached` (a new prompt each call on the model without a policy: the path without any
cache work). Latency is the client's wall time per call (median); extproc CPU is the process's CPU
time over the calls (bench/proc_cpu.py) per call. The last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.stack_config import small_config, start_stack  # noqa: E402

KEY = "sk-modelyard-demo"


def _config(work: Path) -> dict:
    data = small_config()
    base = data["models"][0]
    base["deployments"][0].pop("warmup", None)
    data["models"].append({**base, "name": "demo-gpt-cached", "cache": {"mode": "exact", "ttl_s": 3600}})
    # A generous lookup bound: on a busy box a slow lookup is a miss by design, which is not what is measured.
    data["response_cache"] = {"sqlite_path": str(work / "rcache.sqlite"), "lookup_timeout_ms": 2000}
    return data


def _case(client: httpx.Client, pid: int, n: int, model: str, prompt: str, fresh: bool,
          expect: str | None) -> tuple[float, float]:
    """(median ms per call, extproc CPU us per call) over `n` calls."""
    lat = []
    before = cpu_seconds(pid)
    for i in range(n):
        body = {"model": model, "max_tokens": 32,
                "messages": [{"role": "user", "content": f"{prompt} {i}" if fresh else prompt}]}
        t0 = time.perf_counter()
        r = client.post("/v1/chat/completions", content=orjson.dumps(body),
                        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
        lat.append(time.perf_counter() - t0)
        if r.status_code != 200 or r.headers.get("x-modelyard-cache") != expect:
            print(f"FAILED: {model}: {r.status_code} cache={r.headers.get('x-modelyard-cache')}: {r.text[:200]}",
                  flush=True)
            raise SystemExit(1)
    cpu = cpu_seconds(pid) - before
    return statistics.median(lat) * 1000, cpu / n * 1e6


def _committed(path: Path, timeout: float = 10.0) -> None:
    """Until the writer thread has committed the entry the hit case reads."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(path) as conn:
            if conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]:
                return
        if time.monotonic() > deadline:
            print("FAILED: the first answer was never stored", flush=True)
            raise SystemExit(1)
        time.sleep(0.02)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=scaled(1000, 30))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    a = p.parse_args(argv)
    results: dict[str, list[tuple[float, float]]] = {"hit": [], "miss": [], "uncached": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = _config(work)
        with start_stack(work, data) as stack, httpx.Client(base_url=stack.url, timeout=30) as client:
            pid = stack.child("extproc").proc.pid
            _case(client, pid, 1, "demo-gpt-cached", "the cached call", False, "miss")  # stored once
            _committed(work / "rcache.sqlite")
            for r in range(a.rounds):  # interleaved: a noisy neighbour hits every case alike
                results["hit"].append(_case(client, pid, a.requests, "demo-gpt-cached", "the cached call", False,
                                            "hit"))
                results["miss"].append(_case(client, pid, a.requests, "demo-gpt-cached", f"new call r{r}", True,
                                             "miss"))
                results["uncached"].append(_case(client, pid, a.requests, "demo-gpt", f"plain call r{r}", True,
                                                 None))
    rows = []
    miss_ms = statistics.median(x[0] for x in results["miss"])
    miss_us = statistics.median(x[1] for x in results["miss"])
    print(f"{'case':<10}{'latency ms (median)':>22}{'extproc CPU us/call':>22}{'vs miss':>10}")
    for case, runs in results.items():
        ms = statistics.median(x[0] for x in runs)
        us = statistics.median(x[1] for x in runs)
        print(f"{case:<10}{ms:>22.2f}{us:>22.0f}{us / miss_us:>10.2f}")
        rows.append({"bench": "cache", "case": case, "metric": "latency_p50", "value": round(ms, 2), "unit": "ms",
                     "ratio": round(ms / miss_ms, 2)})
        rows.append({"bench": "cache", "case": case, "metric": "extproc_cpu_per_request", "value": round(us),
                     "unit": "us", "ratio": round(us / miss_us, 2)})
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
