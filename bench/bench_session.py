"""The request path's own CPU, in-process: `Session` under the shipped modelyard.yaml, this tree
against another checkout, rounds alternated.

    .venv/bin/python bench/bench_session.py [BASE] [--rounds 8] [--requests 2000] [--concurrency 16]
    .venv/bin/python bench/bench_session.py --pure-base   # this tree: pure Python (base) vs its compiled build

Each round runs one child process per tree (its code on PYTHONPATH, this file's method): the
gateway `extproc.service.build_gateway` builds from the shipped config (auth, scheduler, rate
limits, metering and audit with their journals, tasks; watermark sources dropped, as the unit
benches do), fed the four messages Envoy sends for a unary OpenAI chat call, `--concurrency`
sessions at once. A child reports the process's CPU per request (every thread, the writers
drained by closing the gateway inside the measurement) and the event-loop thread's CPU per step.
Without BASE only this tree runs. Rows are medians over rounds; the last stdout line is
`SUMMARY [...]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEPS = ("request_headers", "request_body", "response_headers", "response_body", "close")


def _child(requests: int, concurrency: int, warmup: int) -> dict[str, Any]:
    """One tree's figures (its code is first on sys.path: PYTHONPATH)."""
    import orjson
    import yaml
    from envoy.config.core.v3 import base_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    from contracts.config import parse_config
    from extproc.service import build_gateway, build_routes
    from extproc.session import Session

    def headers(pairs: list[tuple[str, str]], response: bool = False) -> Any:
        hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs])
        h = pb.HttpHeaders(headers=hm, end_of_stream=False)
        return pb.ProcessingRequest(response_headers=h) if response else pb.ProcessingRequest(request_headers=h)

    def body(data: bytes, response: bool = False) -> Any:
        b = pb.HttpBody(body=data, end_of_stream=True)
        return pb.ProcessingRequest(response_body=b) if response else pb.ProcessingRequest(request_body=b)

    # Envoy's header sets as it sends them for `openai` SDK-like calls (pseudo-headers, forwarding).
    messages = [
        headers([(":authority", "127.0.0.1:10000"), (":path", "/v1/chat/completions"), (":method", "POST"),
                 (":scheme", "http"), ("content-type", "application/json"), ("accept", "application/json"),
                 ("authorization", "Bearer sk-modelyard-demo"), ("user-agent", "OpenAI/Python 1.50.0"),
                 ("content-length", "80"), ("x-forwarded-proto", "http"),
                 ("x-request-id", "5d1f4a8e-7c3b-4f2a-9e61-0b8c2d7f3a11")]),
        body(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hello from the bench"}]})),
        headers([(":status", "200"), ("content-type", "application/json"), ("content-length", "190"),
                 ("date", "Fri, 04 Dec 2026 07:00:00 GMT"), ("server", "envoy"),
                 ("x-envoy-upstream-service-time", "1")], response=True),
        body(orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                           "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                        "finish_reason": "stop"}],
                           "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}),
             response=True),
    ]
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    for m in data["models"]:
        for d in m["deployments"]:
            d.pop("watermark", None)  # no agents run here
    run = Path(tempfile.mkdtemp(prefix="bench-session-"))
    data["extproc"]["metering_db"] = str(run / "metering.sqlite")
    data["extproc"]["audit_db"] = str(run / "audit.sqlite")
    data["extproc"]["tasks"]["sqlite_path"] = str(run / "tasks.sqlite")
    gw = build_gateway(parse_config(data))
    routes = build_routes()
    steps = dict.fromkeys(STEPS, 0)

    async def one() -> None:
        s = Session(gw, routes)
        for name, m in zip(STEPS, messages, strict=False):
            t0 = time.thread_time_ns()
            r = await s.handle(m)
            steps[name] += time.thread_time_ns() - t0
            # A request the gateway answered itself (a refusal, an error) is not the path measured.
            if r.WhichOneof("response") == "immediate_response":
                raise SystemExit(f"the gateway answered {r.immediate_response.status.code}: "
                                 f"{r.immediate_response.body[:200]!r}")
            await asyncio.sleep(0)  # one loop turn per message, as the servicer's reads give
        t0 = time.thread_time_ns()
        s.close()
        steps["close"] += time.thread_time_ns() - t0

    async def many(n: int) -> None:
        for _ in range(n // concurrency):
            await asyncio.gather(*(one() for _ in range(concurrency)))

    async def main() -> tuple[float, float]:
        await many(warmup)
        steps.update(dict.fromkeys(STEPS, 0))
        p0, t0 = time.process_time(), time.thread_time()
        await many(requests)
        loop_s = time.thread_time() - t0
        await gw.close()  # the writers' rows of these requests are inside the measurement
        return time.process_time() - p0, loop_s

    process_s, loop_s = asyncio.run(main())
    shutil.rmtree(run, ignore_errors=True)
    n = requests // concurrency * concurrency
    import extproc
    try:
        from contracts.compiled import loaded
        build = loaded()
    except ImportError:  # a tree from before the compiled build
        build = "pure"
    return {"tree": str(Path(extproc.__file__).resolve().parent.parent), "build": build, "process": process_s / n * 1e6, "loop": loop_s / n * 1e6, **{k: v / n / 1e3 for k, v in steps.items()}}


def _run_child(tree: Path, a: argparse.Namespace, pure: bool = False) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("MODELYARD_PURE_PYTHON", None)
    if pure:  # contracts/compiled.py: the pure-Python modules even where a compiled build sits beside them
        env["MODELYARD_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, __file__, "--child", "--requests", str(a.requests), "--concurrency",
                          str(a.concurrency), "--warmup", str(a.warmup)], env=env, cwd=tree, check=True,
                         capture_output=True, text=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if got.pop("tree") != str(tree):  # the child must have measured the tree it was given
        raise SystemExit(f"FAILED: the child for {tree} imported another tree's code")
    build = got.pop("build", "pure")  # a tree from before contracts/compiled.py is pure
    if pure and build != "pure":
        raise SystemExit("FAILED: the pure-Python child loaded the compiled build")
    return got


def main(argv: list[str] | None = None) -> int:
    # Not at import: a child must import its tree's modules (PYTHONPATH), not this one's.
    sys.path.insert(0, str(ROOT))
    from bench.smoke import scaled

    p = argparse.ArgumentParser()
    p.add_argument("base", type=Path, nargs="?", help="another checkout (a git worktree)")
    p.add_argument("--rounds", type=int, default=scaled(8, 1))
    p.add_argument("--requests", type=int, default=scaled(2000, 64))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warmup", type=int, default=scaled(400, 16))
    p.add_argument("--pure-base", action="store_true",
                   help="base: this tree's pure-Python build; this: its compiled build (make compiled)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        sys.path.remove(str(ROOT))  # PYTHONPATH's tree first
        print(json.dumps(_child(a.requests, a.concurrency, a.warmup)))
        return 0
    trees = {"this": ROOT} if a.base is None and not a.pure_base else {"base": (a.base or ROOT).resolve(), "this": ROOT}
    got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for i in range(a.rounds):
        order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
        for who, tree in order:  # alternated: a noisy neighbour hits both trees alike
            got[who].append(_run_child(tree, a, pure=a.pure_base and who == "base"))
    rows = []
    cols = ("process", "loop", *STEPS)
    print(f"CPU us per request, median of {a.rounds} rounds, {a.requests} requests, c={a.concurrency}")
    print(f"{'':<8}" + "".join(f"{c:>18}" for c in cols))
    med = {who: {c: statistics.median(r[c] for r in runs) for c in cols} for who, runs in got.items()}
    for who in trees:
        print(f"{who:<8}" + "".join(f"{med[who][c]:>18.1f}" for c in cols))
        rows += [{"bench": "session", "case": f"{who} {c}", "metric": "cpu_per_request",
                  "value": round(med[who][c], 1), "unit": "us"} for c in cols]
    if "base" in med:
        print(f"{'ratio':<8}" + "".join(f"{med['this'][c] / med['base'][c]:>18.2f}" for c in cols))
        # the ratio per round pair as well: the spread says how far to trust the medians
        pairs = [t["process"] / b["process"] for b, t in zip(got["base"], got["this"], strict=True)]
        print("process ratio per round: " + " ".join(f"{r:.2f}" for r in pairs))
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
