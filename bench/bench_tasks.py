"""Async tasks: what `Prefer: respond-async` costs next to a synchronous call, on one small stack.

- latency of the 202 (accept: auth, parse, route, admit, one durable SQLite write) against the
  synchronous round trip to the demo upstream, sequential, median of `--n`;
- extproc CPU per request: the process's CPU-time delta over `--n` synchronous calls, and over
  `--n` tasks accepted and run to completion (the accept stream, the replay's stream, the store
  writes; no polls until the end), measured as the guide says: steadier than req/s here;
- tasks/s from the first 202 to the last task finished, with the worker's default concurrency.

Any unexpected status fails the bench with a `FAILED:` line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.stack_config import small_config, start_stack  # noqa: E402

KEY = "sk-modelyard-demo"
AUTH = {"authorization": f"Bearer {KEY}"}
BODY = {"model": "demo-gpt", "messages": [{"role": "user", "content": "hello from the tasks bench"}]}




def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=scaled(200, 5))
    a = p.parse_args(argv)
    failures: list[str] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tasks-") as tmp:
        data = small_config()
        data["extproc"]["tasks"] = {"sqlite_path": str(Path(tmp) / "tasks.sqlite")}
        with start_stack(Path(tmp), data) as stack, httpx.Client(base_url=stack.url, timeout=60) as c:
            pid = stack.child("extproc").proc.pid
            url = "/v1/chat/completions"
            for _ in range(scaled(20, 2)):  # warm-up
                r = c.post(url, json=BODY, headers=AUTH)
                if r.status_code != 200:
                    failures.append(f"warm-up: {r.status_code}")

            sync_lat = []
            cpu0 = cpu_seconds(pid)
            for _ in range(a.n):
                t = time.perf_counter()
                r = c.post(url, json=BODY, headers=AUTH)
                sync_lat.append(time.perf_counter() - t)
                if r.status_code != 200:
                    failures.append(f"sync: {r.status_code}")
            sync_cpu = (cpu_seconds(pid) - cpu0) / a.n

            accept_lat, ids = [], []
            cpu0 = cpu_seconds(pid)
            t_first = time.perf_counter()
            for _ in range(a.n):
                t = time.perf_counter()
                r = c.post(url, json=BODY, headers={**AUTH, "prefer": "respond-async"})
                accept_lat.append(time.perf_counter() - t)
                if r.status_code != 202:
                    failures.append(f"accept: {r.status_code}")
                    continue
                ids.append(r.json()["id"])
            # The last task (FIFO) ends last: long-poll it, then check them all.
            while ids and c.get(f"/v1/tasks/{ids[-1]}?wait=8", headers=AUTH).json()["status"] in ("queued", "running"):
                pass
            t_last = time.perf_counter()
            task_cpu = (cpu_seconds(pid) - cpu0) / a.n
            for task_id in ids:
                status = c.get(f"/v1/tasks/{task_id}", headers=AUTH).json()["status"]
                if status != "succeeded":
                    failures.append(f"task {status}")
    for f in sorted(set(failures)):
        print(f"FAILED: {f} x{failures.count(f)}")
    sync_ms = statistics.median(sync_lat) * 1000
    accept_ms = statistics.median(accept_lat) * 1000
    rows = [
        {"bench": "tasks", "case": "sync round trip", "metric": "p50", "value": sync_ms, "unit": "ms"},
        {"bench": "tasks", "case": "202 accept", "metric": "p50", "value": accept_ms, "unit": "ms",
         "ratio": accept_ms / sync_ms},
        {"bench": "tasks", "case": "sync request", "metric": "extproc cpu", "value": sync_cpu * 1e6, "unit": "us"},
        {"bench": "tasks", "case": "async task (accept+replay)", "metric": "extproc cpu", "value": task_cpu * 1e6,
         "unit": "us", "ratio": task_cpu / sync_cpu},
        {"bench": "tasks", "case": "accepted -> all done", "metric": "throughput",
         "value": a.n / (t_last - t_first), "unit": "tasks/s"},
    ]
    for row in rows:
        ratio = f" (x{row['ratio']:.2f})" if "ratio" in row else ""
        print(f"{row['case']:<28} {row['metric']:<12} {row['value']:10.1f} {row['unit']}{ratio}")
    print("SUMMARY " + json.dumps(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
