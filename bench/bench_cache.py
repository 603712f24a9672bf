"""What a response-cache hit costs against a miss, through a real Envoy and extproc.

    .venv/bin/python bench/bench_cache.py [--requests N] [--rounds R]

One stack (the demo OpenAI upstream, a model with `cache: {mode: exact}`, one with the shipped
`mode: semantic` policy embedding through `demo-embed`, and one without), one caller (httpx,
keep-alive, sequential). Cases: `hit` (the same call again and again: answered from the
request-body step), `semantic_hit` (a paraphrase of a stored prompt, again and again: exact miss,
the embedding call, the index, then the stored answer), `miss` (a new prompt each call on the
cached model: lookup, upstream, store), `semantic_miss` (the same on the semantic model: also the
embedding and the vector stored), `uncached` (a new prompt each call on the model without a
policy: the path without any cache work), `direct` (the same call straight at the demo upstream,
no gateway: the floor a hit is compared with). Latency is the client's wall time per call
(median); CPU per call is each process's CPU time over the calls (bench/proc_cpu.py): the extproc,
and the gateway (Envoy + extproc). The semantic cases' embedding runs in the demo upstream's
process, not counted as the gateway's. The last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.e2e.semantic_stack import semantic_config  # noqa: E402
from tests.stack_config import start_stack  # noqa: E402

KEY = "sk-modelyard-demo"
SEMANTIC = "demo-gpt-semantic"


def _config(work: Path) -> dict:
    data = semantic_config(work)  # demo-gpt, demo-gpt-semantic (the shipped policy) and demo-embed
    base = data["models"][0]
    data["models"].append({**base, "name": "demo-gpt-cached", "cache": {"mode": "exact", "ttl_s": 3600}})
    # A generous lookup bound: on a busy box a slow lookup is a miss by design, which is not what is measured.
    data["response_cache"] = {"sqlite_path": str(work / "rcache.sqlite"), "lookup_timeout_ms": 2000}
    data["models"][1]["cache"] = {**data["models"][1]["cache"], "embedding_timeout_ms": 2000}
    return data


def _case(client: httpx.Client, pids: tuple[int, int], n: int, model: str, prompt: str, fresh: bool,
          expect: str | None, path: str = "/v1/chat/completions", unlike: bool = False) -> tuple[float, float, float]:
    """(median ms per call, extproc CPU us per call, gateway CPU us per call) over `n` calls; `unlike`: each
    prompt random hex words (no two alike even by similarity)."""
    lat = []
    before = [cpu_seconds(p) for p in pids]
    for i in range(n):
        body = {"model": model, "max_tokens": 32,
                "messages": [{"role": "user", "content": " ".join(uuid.uuid4().hex for _ in range(3)) if unlike
                              else f"{prompt} {i}" if fresh else prompt}]}
        t0 = time.perf_counter()
        r = client.post(path, content=orjson.dumps(body),
                        headers={"authorization": f"Bearer {KEY}", "content-type": "application/json"})
        lat.append(time.perf_counter() - t0)
        verdict = r.headers.get("x-modelyard-cache")
        ok = verdict == expect or (expect == "semantic" and (verdict or "").startswith("semantic;score="))
        if r.status_code != 200 or not ok:
            print(f"FAILED: {model}: {r.status_code} cache={verdict}: {r.text[:200]}", flush=True)
            raise SystemExit(1)
    extproc, envoy = (cpu_seconds(p) - b for p, b in zip(pids, before, strict=True))
    return statistics.median(lat) * 1000, extproc / n * 1e6, (extproc + envoy) / n * 1e6


def _committed(path: Path, table: str = "entries", timeout: float = 10.0) -> None:
    """Until the writer thread has committed the entry the hit case reads."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(path) as conn:
            if conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]:
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
    cases = ("hit", "semantic_hit", "miss", "semantic_miss", "uncached", "direct")
    results: dict[str, list[tuple[float, float, float]]] = {c: [] for c in cases}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = _config(work)
        upstream = data["models"][0]["deployments"][0]["endpoints"][0]
        with start_stack(work, data) as stack, httpx.Client(base_url=stack.url, timeout=30) as client, \
                httpx.Client(base_url=f"http://{upstream}", timeout=30) as direct:
            pids = (stack.child("extproc").proc.pid, stack.child("envoy").proc.pid)
            _case(client, pids, 1, "demo-gpt-cached", "the cached call", False, "miss")  # stored once
            _committed(work / "rcache.sqlite")
            _case(client, pids, 1, SEMANTIC, "What is the capital city of France?", False, "miss")
            _committed(work / "rcache.sqlite", "vectors")
            for r in range(a.rounds):  # interleaved: a noisy neighbour hits every case alike
                results["hit"].append(_case(client, pids, a.requests, "demo-gpt-cached", "the cached call", False,
                                            "hit"))
                results["semantic_hit"].append(_case(client, pids, a.requests, SEMANTIC,
                                                     "what was the capital city of france", False, "semantic"))
                results["miss"].append(_case(client, pids, a.requests, "demo-gpt-cached", f"new call r{r}", True,
                                             "miss"))
                results["semantic_miss"].append(_case(client, pids, a.requests, SEMANTIC, "", True, "miss",
                                                      unlike=True))
                results["uncached"].append(_case(client, pids, a.requests, "demo-gpt", f"plain call r{r}", True,
                                                 None))
                # No gateway: the gateway CPU columns read only its background work (polls, timers).
                results["direct"].append(_case(direct, pids, a.requests, "demo-gpt", f"direct call r{r}", True, None))
    rows = []
    base_ms = statistics.median(x[0] for x in results["miss"])
    base_us = statistics.median(x[2] for x in results["miss"])
    print("box: shared, busy (load printed by the caller); medians of rounds")
    print(f"{'case':<15}{'latency ms (median)':>21}{'extproc CPU us':>16}{'gateway CPU us':>16}{'ms vs miss':>12}"
          f"{'CPU vs miss':>13}")
    for case, runs in results.items():
        ms = statistics.median(x[0] for x in runs)
        ex = statistics.median(x[1] for x in runs)
        gw = statistics.median(x[2] for x in runs)
        print(f"{case:<15}{ms:>21.2f}{ex:>16.0f}{gw:>16.0f}{ms / base_ms:>12.2f}{gw / base_us:>13.2f}")
        rows.append({"bench": "cache", "case": case, "metric": "latency_p50", "value": round(ms, 2), "unit": "ms",
                     "ratio": round(ms / base_ms, 2)})
        rows.append({"bench": "cache", "case": case, "metric": "extproc_cpu_per_request", "value": round(ex),
                     "unit": "us"})
        rows.append({"bench": "cache", "case": case, "metric": "gateway_cpu_per_request", "value": round(gw),
                     "unit": "us", "ratio": round(gw / base_us, 2)})
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
