"""The request path's own CPU, in-process: `Session` under the shipped modelyard.yaml, this tree
against another checkout, rounds alternated.

    .venv/bin/python bench/bench_session.py [BASE] [--rounds 8] [--requests 2000] [--concurrency 16]
    .venv/bin/python bench/bench_session.py --pure-base   # this tree: pure Python (base) vs its compiled build
    .venv/bin/python bench/bench_session.py --stream [BASE] [--body-messages 4]   # the streamed call
    .venv/bin/python bench/bench_session.py --ledger   # this tree with each feature off in turn, then all
    .venv/bin/python bench/bench_session.py --duplex [BASE]   # through the duplex wrapper, as shipped

Each round runs one child process per tree (its code on PYTHONPATH, this file's method): the
gateway `extproc.service.build_gateway` builds from the shipped config (auth, scheduler, rate
limits, metering and audit with their journals, tasks; watermark sources dropped, as the unit
benches do), fed the four messages Envoy sends for a unary OpenAI chat call, `--concurrency`
sessions at once. A child reports the process's CPU per request (every thread, the writers
drained by closing the gateway inside the measurement) and the event-loop thread's CPU per step.
Without BASE only this tree runs. Rows are medians over rounds; the last stdout line is
`SUMMARY [...]`.

`--stream`: bench_peers.py's streamed call instead (demo-gpt, `stream: true`, the client not asking
for usage, so the gateway injects `stream_options.include_usage` and strips the usage chunk): the
demo upstream's ~126 SSE events as its own encoder writes them, sent as Envoy sends them on loopback,
in `--body-messages` large messages cut at event ends, then an empty end-of-stream one. The
`response_body` column is all of a stream's body messages together. A smoke run measures both shapes.

`--duplex`: the same messages through `extproc.duplex.DuplexSession`, as the shipped config's paths run
(FULL_DUPLEX_STREAMED): the header steps' replies held for their bodies, each body step answering both.
Without it the session is driven buffered, as before the duplex design (a base that predates it can run).
A smoke run measures both shapes both ways.

`--ledger`: what each feature of the shipped config costs the unary call, as this tree with that one
feature off (`WITHOUT`) against all on, rounds alternated, then with every one of them off at once
(`bare`: what auth, the one deployment's routing, the translation and the replies cost alone).
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


def _without_audit(data: dict) -> None:
    data["extproc"]["audit_db"] = None


def _without_metering(data: dict) -> None:
    data["extproc"]["metering_db"] = None


def _without_limits(data: dict) -> None:
    data.pop("ratelimit", None)


def _without_routing_extras(data: dict) -> None:
    data["routing"] = {}  # A/B weights, the bandit, the breakers and the share breakers


def _without_second_deployment(data: dict) -> None:
    model = next(m for m in data["models"] if m["name"] == "demo-gpt")
    model["deployments"] = model["deployments"][:1]  # nothing to score between


def _without_guardrails(data: dict) -> None:
    data.pop("guardrails", None)


# --ledger: the shipped config's features the bench's call runs through, each one that can be turned off.
WITHOUT = {"audit": _without_audit, "metering": _without_metering, "limits": _without_limits,
           "routing-extras": _without_routing_extras, "second-deployment": _without_second_deployment,
           "guardrails": _without_guardrails}


def _stream_body(body: bytes) -> bytes:
    """The SSE bytes the demo OpenAI upstream answers the gateway's upstream request for `body`."""
    from adapters import openai
    from devstack.demo.behaviour import demo_reply, demo_stream_events

    req = openai.parse_request(body)
    up, injected = openai.passthrough_body(body, req, upstream_model=req.model)
    assert injected, "the bench's stream asks for no usage: the gateway must inject it"
    up_req = openai.parse_request(up)
    resp = demo_reply(up_req, "[demo-openai]", response_id="demo-openai-1")
    encoder = openai.StreamEncoder(model=up_req.model, request=up_req)
    return b"".join(encoder.encode([ev]) for ev in demo_stream_events(resp))


def _cut(raw: bytes, parts: int) -> list[bytes]:
    """`raw` in `parts` pieces of about equal size, each ending at an event's end (as the demo's writes)."""
    out, start = [], 0
    for i in range(1, parts):
        end = raw.find(b"\n\n", len(raw) * i // parts) + 2
        if end > start + 1:
            out.append(raw[start:end])
            start = end
    return [*out, raw[start:]]


def _child(requests: int, concurrency: int, warmup: int, stream: bool = False,
           body_messages: int = 4, without: tuple[str, ...] = (), duplex: bool = False) -> dict[str, Any]:
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

    def body(data: bytes, response: bool = False, end: bool = True) -> Any:
        b = pb.HttpBody(body=data, end_of_stream=end)
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
    if stream:  # bench_peers.py's STREAM call; its answer as Envoy forwards an SSE body
        req_body = orjson.dumps({"model": "demo-gpt", "stream": True, "messages": [
            {"role": "user", "content": " ".join(["hello from the streaming benchmark"] * 24 + ["now"])}]})
        messages[1] = body(req_body)
        messages[2] = headers([(":status", "200"), ("content-type", "text/event-stream"),
                               ("cache-control", "no-cache"), ("date", "Fri, 04 Dec 2026 07:00:00 GMT"),
                               ("server", "envoy"), ("x-envoy-upstream-service-time", "1")], response=True)
        sse = _stream_body(req_body)
        messages[3:] = [*(body(piece, response=True, end=False) for piece in _cut(sse, body_messages)),
                        body(b"", response=True)]
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    for m in data["models"]:
        for d in m["deployments"]:
            d.pop("watermark", None)  # no agents run here
    run = Path(tempfile.mkdtemp(prefix="bench-session-"))
    data["extproc"]["metering_db"] = str(run / "metering.sqlite")
    data["extproc"]["audit_db"] = str(run / "audit.sqlite")
    data["extproc"]["tasks"]["sqlite_path"] = str(run / "tasks.sqlite")
    for name in without:  # after the paths above: a feature off stays off
        WITHOUT[name](data)
    gw = build_gateway(parse_config(data))
    routes = build_routes()
    steps = dict.fromkeys(STEPS, 0)
    wrap: Any = None
    if duplex:  # the shipped paths' design: behind the FULL_DUPLEX_STREAMED wrapper (a base before it runs without)
        from extproc.duplex import DuplexSession as wrap

    def session() -> Any:
        s = Session(gw, routes)
        return wrap(s, gw.config.extproc.max_body_bytes) if duplex else s

    async def one() -> None:
        s = session()
        for i, m in enumerate(messages):
            name = STEPS[min(i, 3)]  # every body message of a stream counts as its response_body
            t0 = time.thread_time_ns()
            r: Any = await s.handle(m)
            steps[name] += time.thread_time_ns() - t0
            if duplex:  # a list: none for headers held for their body, then the headers' reply and the body's
                if not r and name.endswith("_headers"):
                    await asyncio.sleep(0)
                    continue
                r = r[-1] if r else None
            # Not Interim (a step that waits; a revision compared may not have it): this chat answers each at once.
            if not isinstance(r, pb.ProcessingResponse):
                raise SystemExit(f"no reply to {name}: {r!r}")
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


def _run_child(tree: Path, a: argparse.Namespace, pure: bool = False,
               without: tuple[str, ...] = ()) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("MODELYARD_PURE_PYTHON", None)
    if pure:  # contracts/compiled.py: the pure-Python modules even where a compiled build sits beside them
        env["MODELYARD_PURE_PYTHON"] = "1"
    shape = ["--stream", "--body-messages", str(a.body_messages)] if a.stream else []
    shape += ["--duplex"] if a.duplex else []
    shape += ["--without", ",".join(without)] if without else []
    out = subprocess.run([sys.executable, __file__, "--child", "--requests", str(a.requests), "--concurrency",
                          str(a.concurrency), "--warmup", str(a.warmup), *shape], env=env, cwd=tree, check=True,
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
    from bench.smoke import SMOKE, scaled

    p = argparse.ArgumentParser()
    p.add_argument("base", type=Path, nargs="?", help="another checkout (a git worktree)")
    p.add_argument("--rounds", type=int, default=scaled(8, 1))
    p.add_argument("--requests", type=int, default=scaled(2000, 64))
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warmup", type=int, default=scaled(400, 16))
    p.add_argument("--pure-base", action="store_true",
                   help="base: this tree's pure-Python build; this: its compiled build (make compiled)")
    p.add_argument("--stream", action="store_true", help="the streamed call (bench_peers.py's stream shape)")
    p.add_argument("--body-messages", type=int, default=4, help="--stream: the SSE body's messages before its end")
    p.add_argument("--duplex", action="store_true",
                   help="through extproc.duplex's wrapper, as the shipped paths run (FULL_DUPLEX_STREAMED)")
    p.add_argument("--ledger", action="store_true", help="each feature's cost: this tree with it off, then all off")
    p.add_argument("--without", default="", help=argparse.SUPPRESS)  # a child's features off (WITHOUT's names)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        sys.path.remove(str(ROOT))  # PYTHONPATH's tree first
        without = tuple(n for n in a.without.split(",") if n)
        print(json.dumps(_child(a.requests, a.concurrency, a.warmup, a.stream, a.body_messages, without,
                                        a.duplex)))
        return 0
    if a.ledger:
        print("SUMMARY " + json.dumps(_ledger(a)))
        return 0
    if SMOKE and not a.stream:  # smoke: both shapes' code paths, and the ledger's with one feature off
        rows = _measure(a) + _ledger(a, features=tuple(WITHOUT)[:1])
        for a.stream, a.duplex in ((True, False), (False, True), (True, True)):  # and through the shipped wrapper
            rows += _measure(a)
        print("SUMMARY " + json.dumps(rows))
        return 0
    print("SUMMARY " + json.dumps(_measure(a)))
    return 0


def _ledger(a: argparse.Namespace, features: tuple[str, ...] = tuple(WITHOUT)) -> list[dict[str, Any]]:
    """This tree with each feature off in turn and with all off, against all on: rounds alternated."""
    cases = {"all on": (), **{f"without {n}": (n,) for n in features}, "bare": tuple(WITHOUT)}
    got: dict[str, list[float]] = {c: [] for c in cases}
    pure = os.environ.get("MODELYARD_PURE_PYTHON", "") not in ("", "0")  # the build asked for, as `modelyard up`
    for i in range(a.rounds):
        names = list(cases)
        for case in names[i % len(names):] + names[:i % len(names)]:  # rotated: none always first
            got[case].append(_run_child(ROOT, a, pure=pure, without=cases[case])["process"])
    med = {c: statistics.median(v) for c, v in got.items()}
    print(f"unary: process CPU us per request by feature ({'pure' if pure else 'the build present'}), median of "
          f"{a.rounds} rounds, {a.requests} requests, c={a.concurrency}")
    print(f"{'':<28}{'us':>10}{'less than all on':>20}{'ratio':>10}")
    for c, v in med.items():
        print(f"{c:<28}{v:>10.1f}{med['all on'] - v:>20.1f}{v / med['all on']:>10.2f}")
    return [{"bench": "session", "case": f"ledger {c}", "metric": "cpu_per_request", "value": round(v, 1),
             "unit": "us"} for c, v in med.items()]


def _measure(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the rounds, print the table, return the SUMMARY rows."""
    trees = {"this": ROOT} if a.base is None and not a.pure_base else {"base": (a.base or ROOT).resolve(), "this": ROOT}
    got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for i in range(a.rounds):
        order = list(trees.items()) if i % 2 == 0 else list(reversed(trees.items()))
        for who, tree in order:  # alternated: a noisy neighbour hits both trees alike
            got[who].append(_run_child(tree, a, pure=a.pure_base and who == "base"))
    rows = []
    cols = ("process", "loop", *STEPS)
    shape = ("stream" if a.stream else "unary") + (" duplex" if a.duplex else "")
    label = ("stream " if a.stream else "") + ("duplex " if a.duplex else "")
    print(f"{shape}: CPU us per request, median of {a.rounds} rounds, {a.requests} requests, c={a.concurrency}")
    print(f"{'':<8}" + "".join(f"{c:>18}" for c in cols))
    med = {who: {c: statistics.median(r[c] for r in runs) for c in cols} for who, runs in got.items()}
    for who in trees:
        print(f"{who:<8}" + "".join(f"{med[who][c]:>18.1f}" for c in cols))
        rows += [{"bench": "session", "case": f"{label}{who} {c}",
                  "metric": "cpu_per_request",
                  "value": round(med[who][c], 1), "unit": "us"} for c in cols]
    if "base" in med:
        print(f"{'ratio':<8}" + "".join(f"{med['this'][c] / med['base'][c]:>18.2f}" for c in cols))
        # the ratio per round pair as well: the spread says how far to trust the medians
        pairs = [t["process"] / b["process"] for b, t in zip(got["base"], got["this"], strict=True)]
        print("process ratio per round: " + " ".join(f"{r:.2f}" for r in pairs))
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
