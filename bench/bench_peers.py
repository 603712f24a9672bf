"""Peers side by side: Modelyard (the shipped demo config on free ports), Portkey's gateway 1.15.2
(Node, installed into .peers/portkey) and LiteLLM's proxy (one worker, its own venv) in front of
the same demo OpenAI upstream, with the same wrk settings, in one run.

Shapes: a unary chat call and a ~100-chunk SSE stream, each at 1 and 16 connections, interleaved
rounds, medians. Per gateway and case: req/s (200s only), p50, and gateway CPU per request (user +
system of every process of the gateway: Envoy + extproc for Modelyard, node for Portkey, the proxy
and its children for LiteLLM, from /proc over the round, divided by its 200s). Then the ratios
issue 38's goals name. LiteLLM runs the unary shape only (its streams are not a goal).

Beside the goals, no goal yet: the latency each gateway adds at fixed open-loop rates (`--rates`,
100 and 300 calls/s: bench/open_loop.py, p50 and p99 less the upstream's own at the same rate; a
gateway that serves under 1.25x a rate closed-loop is left out of it), and each gateway's resident
memory (every process of it) at idle and the highest during its rounds.

    make bench-peers      # installs Portkey into .peers/portkey and LiteLLM into .venv-peers, then runs this
    .venv/bin/python bench/bench_peers.py --builds --floor   # + the shipped config over TCP, compiled and pure
    .venv/bin/python bench/bench_peers.py --floor --base DIR --shapes stream --conns 16   # one lever's own case

A gateway that is not installed is left out and said so; with neither peer it prints an empty
summary (so `make bench` passes by). Any non-200 (or a socket error) fails the bench. Smoke mode
(bench.smoke, run by `make test`) runs Modelyard and the floor only, peers installed or not (their
start-up is most of a smoke's cost, and CI has none): the same rounds, CPU sums and summary, half a
second per case.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.bench_gateway import _floor_stack, _pid, only_demo_gpt_upstreams  # noqa: E402
from bench.floor_designs import skipping_response_headers  # noqa: E402
from bench.open_loop import OpenLoopResult, open_loop  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from bench.wrk_load import WrkResult, post_script, run_wrk  # noqa: E402
from contracts.compiled import PURE_ENV  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Stack  # noqa: E402
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, free_port, start_stack  # noqa: E402

LITELLM = ROOT / ".venv-peers" / "bin" / "litellm"
PORTKEY = ROOT / ".peers" / "portkey" / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
UNARY = '{"model":"demo-gpt","messages":[{"role":"user","content":"hello from the benchmark"}]}'
# The demo upstream streams one event per word of its echo: 97 words in, about 100 chunks out.
STREAM = json.dumps({"model": "demo-gpt", "stream": True, "messages": [
    {"role": "user", "content": " ".join(["hello from the streaming benchmark"] * 24 + ["now"])}]},
    separators=(",", ":"))
SHAPES = {"unary": UNARY, "stream": STREAM}
CONNS = (1, 16)


@dataclass
class Gateway:
    name: str
    url: str  # the chat completions URL
    headers: dict[str, str]
    pids: Callable[[], list[int]]  # the gateway's own top processes (their descendants count too)
    shapes: tuple[str, ...] = ("unary", "stream")
    metrics: str = ""  # a Modelyard extproc's /metrics


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def tree_cpu_s(roots: list[int]) -> float:
    """User + system CPU seconds of `roots` and every live descendant, from /proc."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            parent[int(entry)] = int(fields[1])
            try:
                times[int(entry)] = cpu_seconds(int(entry))
            except OSError:  # gone since the listing
                parent.pop(int(entry))
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in times:
            continue
        seen.add(pid)
        total += times[pid]
        todo += [c for c, p in parent.items() if p == pid]
    return total


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def tree_rss_mb(roots: list[int]) -> float:
    """Resident memory of `roots` and every live descendant (MB), from /proc."""
    parent = {int(e): int(f[1]) for e in os.listdir("/proc") if e.isdigit() and (f := _stat(int(e))) is not None}
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss_mb(pid)
        todo += [c for c, p in parent.items() if p == pid]
    return total


class PeakRss:
    """The highest `tree_rss_mb` of some processes while the block runs (sampled every 0.2 s)."""

    def __init__(self, roots: list[int]) -> None:
        self.roots, self.peak = roots, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, tree_rss_mb(self.roots))
            if self._stop.wait(0.2):
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_mb(self.roots))


def pids_of(proc: subprocess.Popen) -> Callable[[], list[int]]:
    return lambda: [proc.pid]


def stack_pids(stack: Stack) -> Callable[[], list[int]]:
    """The stack's Envoy and extproc, looked up at each call (a restarted child has a new pid)."""
    return lambda: [_pid(stack, c) for c in ("envoy", "extproc")]


def litellm_config(data: dict) -> dict:
    """demo-gpt's deployments (the same upstreams Modelyard's demo config routes to), one model name."""
    model = next(m for m in data["models"] if m["name"] == "demo-gpt")
    entries = []
    for dep in model["deployments"]:
        params = {"model": "openai/demo-gpt", "api_base": f"http://{dep['endpoints'][0]}/v1",
                  "api_key": os.environ.get(dep.get("api_key_env") or "", "unused")}
        entries.append({"model_name": "demo-gpt", "litellm_params": params})
    return {"model_list": entries, "general_settings": {"master_key": DEMO_KEY},
            "litellm_settings": {"set_verbose": False}}


def wait_http(name: str, url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} not ready after {timeout_s:.0f}s")


def extproc_build(gw: Gateway) -> str:
    """The build a Modelyard stack's extproc runs ("compiled" or "pure"), from its /metrics."""
    return "see metrics" if not gw.metrics else next(
        (line.split('build="')[1].split('"')[0] for line in httpx.get(gw.metrics, timeout=5).text.splitlines()
         if line.startswith("modelyard_extproc_build_info{")), "unknown")


def check_stream(gw: Gateway) -> int:
    """One streamed call through `gw`: its data events (it must stream, and end with [DONE])."""
    with httpx.stream("POST", gw.url, content=STREAM, headers=gw.headers, timeout=30) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
        if r.status_code != 200 or not lines or lines[-1].strip() != "data: [DONE]":
            raise RuntimeError(f"{gw.name}: stream check got {r.status_code}, {len(lines)} events")
    return len(lines)


def _by_round(results: dict, cpu: dict, num: tuple, den: tuple) -> str:
    """The same ratio round by round (round i of each gateway ran in the same rotation)."""
    def values(k: tuple) -> list[float]:
        if k[3] == "cpu_us":
            return cpu.get(k[:3], [])
        return [r.ok_rps if k[3] == "rps" else getattr(r, k[3]) for r in results.get(k[:3], [])]
    return " ".join(f"{a / b:.2f}" for a, b in zip(values(num), values(den)) if b)


def base_config(base: Path | None) -> dict:
    """The base stack's config: the base checkout's own shipped modelyard.yaml, which its extproc can
    read (this tree's may name fields added since), on free ports; without a base, this tree's."""
    shipped = base / "modelyard.yaml" if base is not None else None
    return demo_config_free_ports(shipped=shipped)[0] if shipped is not None and shipped.exists() \
        else demo_config_free_ports()[0]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=scaled(4.0, 0.5))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    p.add_argument("--floor", action="store_true",
                   help="also the floor: Modelyard's Envoy with a do-nothing ext_proc (bench/floor_extproc.py)")
    p.add_argument("--builds", action="store_true",
                   help="also the shipped config over loopback TCP, compiled and pure-Python (issue 38: pure vs "
                        "compiled vs compiled + Unix socket; `make compiled` first)")
    p.add_argument("--base", type=Path, default=None,
                   help="also another checkout's extproc (a `git worktree` or `git archive` of the commit before a "
                        "change) on that checkout's own shipped config: its before/after ratios in the same run")
    p.add_argument("--base-env", action="append", default=[], metavar="NAME=VALUE",
                   help="an environment variable for the base stack's extproc (a lever that is a setting, such as grpc "
                        "core's GRPC_EXPERIMENTS); without --base the base stack runs this tree's code")
    p.add_argument("--floor3", action="store_true",
                   help="also the 3-message floor (response headers skipped, bench/floor_designs.py), unary only")
    p.add_argument("--rates", default="100,300",
                   help="open-loop rates (calls/s) for the added-latency table, comma-separated; '' for none")
    p.add_argument("--open-seconds", type=float, default=scaled(5.0, 0.5), help="seconds per open-loop run")
    p.add_argument("--shapes", default=",".join(SHAPES), help="the shapes to run (a lever's own shape: `stream`)")
    p.add_argument("--conns", default=",".join(map(str, CONNS)), help="the connection counts to run (`16`)")
    a = p.parse_args(argv)
    base_env = {name: value for name, sep, value in (pair.partition("=") for pair in a.base_env) if name and sep}
    if len(base_env) < len(a.base_env):
        p.error(f"--base-env takes NAME=VALUE, once per name: {a.base_env}")
    shapes = [s for s in SHAPES if s in a.shapes.split(",")]
    conns_run = [c for c in CONNS if str(c) in a.conns.split(",")]
    rates = [float(r) for r in a.rates.split(",") if r.strip()]
    have_portkey = not SMOKE and PORTKEY.exists() and shutil.which("node") is not None
    have_litellm = not SMOKE and LITELLM.exists()
    a.floor = a.floor or SMOKE  # a smoke run has no peer to stand beside: the floor takes its place
    if not shutil.which("wrk") or not (have_portkey or have_litellm or SMOKE):
        print("bench_peers: needs wrk and a peer (make bench-peers installs Portkey into .peers/portkey and "
              "LiteLLM into .venv-peers); skipped")
        print("SUMMARY []")
        return 0
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    work = scratch.folder("bench-peers-")
    data, _ = demo_config_free_ports()
    (work / "modelyard").mkdir()
    stack = start_stack(work / "modelyard", data)
    stack.quiet = True
    if SMOKE:  # nothing but demo-gpt is called
        only_demo_gpt_upstreams(stack, data)
    upstream = next(d for m in data["models"] if m["name"] == "demo-gpt" for d in m["deployments"]
                    if d["cluster"] == "demo-openai")
    (work / "litellm.yaml").write_text(yaml.safe_dump(litellm_config(data)))
    json_headers = {"Content-Type": "application/json"}
    extra_stacks: list[Stack] = []
    gateways = [Gateway("modelyard", f"{stack.url}/v1/chat/completions",
                        {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                        stack_pids(stack),
                        metrics=f"http://{data['extproc']['metrics_address']}/metrics")]
    stack.child("extproc").env.pop(PURE_ENV, None)
    if a.builds:
        # The shipped config (`modelyard`) runs compiled over its Unix socket; beside it the same config over
        # loopback TCP, compiled and pure: each lever's ratio is one pair of these.
        for name, pure in (("pure-tcp", True), ("comp-tcp", False)):
            bdata, _ = demo_config_free_ports()
            bdata["extproc"]["unix_socket"] = None
            (work / name).mkdir()
            bstack = start_stack(work / name, bdata)  # every demo and agent, as the first stack has
            bstack.quiet = True
            if pure:  # contracts/compiled.py: the pure-Python modules even beside a compiled build
                bstack.child("extproc").env[PURE_ENV] = "1"
            extra_stacks.append(bstack)
            gateways.append(Gateway(name, f"{bstack.url}/v1/chat/completions",
                                    {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                                    stack_pids(bstack),
                                    metrics=f"http://{bdata['extproc']['metrics_address']}/metrics"))
    if a.base is not None or base_env:  # the same stack; only the extproc's code (and its shipped config) or environment differs
        bdata = base_config(a.base)
        (work / "base").mkdir()
        bstack = start_stack(work / "base", bdata)
        bstack.quiet = True
        if a.base is not None:
            bstack.child("extproc").cwd = a.base.resolve()
            bstack.child("extproc").env["PYTHONPATH"] = str(a.base.resolve())
        bstack.child("extproc").env.update(base_env)
        extra_stacks.append(bstack)
        gateways.append(Gateway("base", f"{bstack.url}/v1/chat/completions",
                                {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                                stack_pids(bstack),
                                metrics=f"http://{bdata['extproc']['metrics_address']}/metrics"))
    # The floor of the shipped design beside the peers (chat bodies in full duplex): what no gateway logic at
    # all costs here, reached as the shipped config reaches the extproc (its Unix socket, served by h2).
    floor = _floor_stack(work / "floor", EnvironmentConfig(name="bench", admin=None, concurrency=1),
                         socket_server="h2") if a.floor else None
    if floor is not None:
        gateways.append(Gateway("floor", f"{floor.url}/v1/chat/completions",
                                {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                                stack_pids(floor)))
    # The cheapest unary design Envoy 1.40 allows, where the stream choice is known from the headers
    # (it is not, for the call measured: SSE would be buffered, so unary only).
    floor3 = _floor_stack(work / "floor3", EnvironmentConfig(name="bench", admin=None, concurrency=1),
                          bodies="buffered") if a.floor3 else None
    if floor3 is not None:
        gateways.append(Gateway("floor3", f"{floor3.url}/v1/chat/completions",
                                {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                                stack_pids(floor3), shapes=("unary",)))
    procs: list[subprocess.Popen] = []
    tallies: list[Tally] = []
    results: dict[tuple[str, str, int], list[WrkResult]] = {}
    cpu: dict[tuple[str, str, int], list[float]] = {}
    chunks: dict[str, int] = {}
    idle_rss: dict[str, float] = {}
    load_rss: dict[str, float] = {}  # the highest during its unary and stream rounds
    opened: dict[tuple[str, float], list[OpenLoopResult]] = {}
    logs = open(work / "peers.log", "wb")  # noqa: SIM115  (closed below, after the peers stopped)
    try:
        with stack, floor if floor is not None else contextlib.nullcontext(), \
                skipping_response_headers(floor3) if floor3 is not None else contextlib.nullcontext(), \
                contextlib.ExitStack() as more:
            for extra in extra_stacks:
                more.enter_context(extra)
            builds = {gw.name: extproc_build(gw) for gw in gateways if gw.metrics}
            print("extproc builds: " + ", ".join(f"{k} {v}" for k, v in builds.items()), flush=True)
            if a.builds and (builds["modelyard"], builds["comp-tcp"], builds["pure-tcp"]) != ("compiled",) * 2 + ("pure",):
                raise RuntimeError(f"--builds needs the compiled build (`make compiled`); got {builds}")
            if have_portkey:
                port = free_port()
                proc = subprocess.Popen(["node", str(PORTKEY), f"--port={port}", "--headless"], cwd=PORTKEY.parent,
                                        stdout=logs, stderr=subprocess.STDOUT)
                procs.append(proc)
                wait_http("portkey", f"http://127.0.0.1:{port}/", proc)
                gateways.append(Gateway(
                    "portkey", f"http://127.0.0.1:{port}/v1/chat/completions",
                    {**json_headers, "Authorization": f"Bearer {os.environ[upstream['api_key_env']]}",
                     "x-portkey-provider": "openai",
                     "x-portkey-custom-host": f"http://{upstream['endpoints'][0]}/v1"},
                    pids_of(proc)))
            if have_litellm:
                port = free_port()
                proc = subprocess.Popen([str(LITELLM), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                                         "--port", str(port), "--num_workers", "1"], stdout=logs,
                                        stderr=subprocess.STDOUT)
                procs.append(proc)
                wait_http("litellm", f"http://127.0.0.1:{port}/health/liveliness", proc)
                gateways.append(Gateway("litellm", f"http://127.0.0.1:{port}/v1/chat/completions",
                                        {**json_headers, "Authorization": f"Bearer {DEMO_KEY}"},
                                        pids_of(proc), shapes=("unary",)))
            # Resident memory at idle: every gateway up, none called yet (each stack's start-up checks aside).
            idle_rss = {gw.name: tree_rss_mb(gw.pids()) for gw in gateways}
            scripts: dict[tuple[str, str], Path] = {}
            for gw in gateways:
                gw.shapes = tuple(s for s in gw.shapes if s in shapes)
                if "stream" in gw.shapes:
                    try:
                        chunks[gw.name] = check_stream(gw)
                    except RuntimeError as e:
                        if gw.name == "modelyard":
                            raise
                        # Portkey 1.15.2 on @hono/node-server >= 1.14.2 answers every stream 500 ("immutable"
                        # headers); the Makefile pins 1.14.1 (docs/performance.md, "Portkey's streams").
                        scratch.keep(work)  # the log it points at outlives the run
                        print(f"{e}: its stream shape is left out (see {work / 'peers.log'})", flush=True)
                        gw.shapes = tuple(s for s in gw.shapes if s != "stream")
                for shape in gw.shapes:
                    scripts[(gw.name, shape)] = work / f"{gw.name}-{shape}.lua"
                    scripts[(gw.name, shape)].write_text(post_script(SHAPES[shape], gw.headers))
                    if not SMOKE:  # the smoke's one round runs the same path
                        tallies.append(Tally("peers", f"{gw.name} {shape} warm-up"))
                        run_wrk(gw.url, 4, 2.0, scripts[(gw.name, shape)], tallies[-1])
            print("stream data events per call: " + ", ".join(f"{k} {v}" for k, v in chunks.items()), flush=True)
            for i in range(a.rounds):
                for shape in shapes:
                    for conns in conns_run:
                        # Rotated each round: no gateway always runs first (or right after a given one).
                        for gw in gateways[i % len(gateways):] + gateways[:i % len(gateways)]:
                            if shape not in gw.shapes:
                                continue
                            key = (gw.name, shape, conns)
                            tallies.append(Tally("peers", f"{gw.name} {shape} c={conns} round {i + 1}"))
                            roots = gw.pids()
                            before = tree_cpu_s(roots)
                            with PeakRss(roots) as mem:
                                run = run_wrk(gw.url, conns, a.seconds, scripts[(gw.name, shape)], tallies[-1])
                            used = tree_cpu_s(roots) - before
                            results.setdefault(key, []).append(run)
                            load_rss[gw.name] = max(load_rss.get(gw.name, 0.0), mem.peak)
                            if run.tally.ok:
                                cpu.setdefault(key, []).append(used / run.tally.ok * 1e6)
            # Open loop: the unary call at fixed rates, through each gateway and straight to the upstream.
            direct = Gateway("direct", f"http://{upstream['endpoints'][0]}/v1/chat/completions",
                             {**json_headers, "Authorization": f"Bearer {os.environ[upstream['api_key_env']]}"},
                             lambda: [], shapes=("unary",))
            for i in range(a.rounds if rates and "unary" in shapes else 0):  # the unary call's, as above
                for rate in rates:
                    for gw in [direct, *gateways]:
                        closed = results.get((gw.name, "unary", 16))
                        if closed and statistics.median(r.ok_rps for r in closed) < rate * 1.25:
                            continue  # past (or near) what it serves at all: its latency would be its queue's
                        tallies.append(Tally("peers", f"{gw.name} open loop {rate:g}/s round {i + 1}"))
                        opened.setdefault((gw.name, rate), []).append(
                            open_loop(gw.url, UNARY, gw.headers, rate, a.open_seconds, tallies[-1]))
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        logs.close()
    med: dict[tuple[str, str, int], dict[str, float]] = {}
    print(f"\n{'gateway':<11}{'shape':<8}{'conns':>6}{'ok req/s':>10}{'p50 ms':>9}{'p99 ms':>9}{'cpu us/req':>12}")
    for shape in SHAPES:
        for conns in CONNS:
            for gw in gateways:
                key = (gw.name, shape, conns)
                if key not in results:
                    continue
                runs = results[key]
                med[key] = {"rps": statistics.median(r.ok_rps for r in runs),
                            "p50_ms": statistics.median(r.p50_ms for r in runs),
                            "p99_ms": statistics.median(r.p99_ms for r in runs),
                            "cpu_us": statistics.median(cpu[key]) if cpu.get(key) else float("nan")}
                m = med[key]
                print(f"{gw.name:<11}{shape:<8}{conns:>6}{m['rps']:>10.0f}{m['p50_ms']:>9.2f}{m['p99_ms']:>9.2f}"
                      f"{m['cpu_us']:>12.0f}   rounds: cpu {'/'.join(f'{c:.0f}' for c in cpu.get(key, []))}, "
                      f"p50 {'/'.join(f'{r.p50_ms:.2f}' for r in runs)}")
    rows = []
    for (name, shape, conns), m in med.items():
        for metric, unit in (("rps", "req/s"), ("p50_ms", "ms"), ("cpu_us", "us/req")):
            row = {"bench": "peers", "case": f"{name} {shape} c={conns}", "metric": metric,
                   "value": round(m[metric], 3), "unit": unit}
            portkey = med.get(("portkey", shape, conns)) if name != "portkey" else None
            if portkey and portkey[metric]:
                row.update(baseline=round(portkey[metric], 3), ratio=round(m[metric] / portkey[metric], 3))
            rows.append(row)
    # Issue 38's goals, each a ratio of medians in this run: (what, numerator, denominator, goal, <= or >=).
    goals = [("unary c=16 cpu/req vs portkey", ("modelyard", "unary", 16, "cpu_us"), ("portkey", "unary", 16, "cpu_us"),
              1.25, "<="),
             ("unary c=16 req/s vs portkey", ("modelyard", "unary", 16, "rps"), ("portkey", "unary", 16, "rps"),
              1.0, ">="),
             ("unary c=1 p50 vs portkey", ("modelyard", "unary", 1, "p50_ms"), ("portkey", "unary", 1, "p50_ms"),
              1.6, "<="),
             ("unary c=1 p99 vs portkey", ("modelyard", "unary", 1, "p99_ms"), ("portkey", "unary", 1, "p99_ms"),
              0.7, "<="),
             ("stream c=16 cpu/req vs portkey", ("modelyard", "stream", 16, "cpu_us"),
              ("portkey", "stream", 16, "cpu_us"), 0.8, "<="),
             ("unary c=16 req/s vs litellm", ("modelyard", "unary", 16, "rps"), ("litellm", "unary", 16, "rps"),
              12.0, ">="),
             ("unary c=16 cpu/req over the floor", ("modelyard", "unary", 16, "cpu_us"), ("floor", "unary", 16, "cpu_us"),
              1.4, "<=")]
    print("\nratios (issue 38's goals):")
    for what, num, den, goal, sense in goals:
        n, d = med.get(num[:3]), med.get(den[:3])
        if not n or not d or not d[den[3]]:
            print(f"  {what:<34} -  ({den[0]} not run)")
            continue
        ratio = n[num[3]] / d[den[3]]
        met = ratio <= goal if sense == "<=" else ratio >= goal
        print(f"  {what:<34}{ratio:>7.2f}  goal {sense} {goal:g}: {'met' if met else 'NOT met'}"
              f"  (by round: {_by_round(results, cpu, num, den)})")
        rows.append({"bench": "peers", "case": what, "metric": "ratio", "value": round(ratio, 3), "unit": "x",
                     "baseline": goal, "ratio": round(ratio / goal, 3)})
    # Issue 38's levers, each a pair in this run: the compiler (comp-tcp / pure-tcp), the Unix socket
    # (modelyard / comp-tcp), both (modelyard / pure-tcp), and the floor against the pure build.
    for name, base in (("comp-tcp", "pure-tcp"), ("modelyard", "comp-tcp"), ("modelyard", "pure-tcp"),
                       ("floor", "pure-tcp"), ("floor", "modelyard"), ("modelyard", "base"), ("base", "floor"),
                       ("modelyard", "floor")):
        for shape, conns, metric in (("unary", 16, "cpu_us"), ("unary", 16, "rps"), ("unary", 1, "p50_ms"),
                                     ("unary", 1, "p99_ms"), ("stream", 16, "cpu_us")):
            n, d = med.get((name, shape, conns)), med.get((base, shape, conns))
            if n and d and d[metric]:
                what = f"{name} {shape} c={conns} {metric} vs {base}"
                print(f"  {what:<40}{n[metric] / d[metric]:>7.2f}")
                rows.append({"bench": "peers", "case": what, "metric": "ratio", "value": round(n[metric] / d[metric], 3),
                             "unit": "x"})
    # Not goals: how far the do-nothing floor of Modelyard's design sits from Portkey in this run.
    for name, fshape, fconns, metric in (("floor", "unary", 16, "cpu_us"), ("floor", "unary", 1, "p50_ms"),
                                         ("floor", "stream", 16, "cpu_us"), ("floor3", "unary", 16, "cpu_us"),
                                         ("floor3", "unary", 1, "p50_ms")):
        n, d = med.get((name, fshape, fconns)), med.get(("portkey", fshape, fconns))
        if n and d and d[metric]:
            what = f"{name} {fshape} c={fconns} {'cpu/req' if metric == 'cpu_us' else 'p50'} vs portkey"
            print(f"  {what:<34}{n[metric] / d[metric]:>7.2f}  (the floor, for reference)")
    # No goal yet (issue 38): the latency each gateway adds at a fixed open-loop rate, and its memory.
    if opened:
        print("\nopen loop, unary: p50 / p99 ms, and added over direct (the upstream itself at the same rate)")
    for rate in rates:
        straight = opened.get(("direct", rate))
        if not straight:
            continue
        d50 = statistics.median(r.percentile(50) for r in straight)
        d99 = statistics.median(r.percentile(99) for r in straight)
        for gw in gateways:
            tries = opened.get((gw.name, rate))
            if not tries:
                print(f"  {gw.name:<11}{rate:>6g}/s  not run: it serves under {rate * 1.25:g}/s closed-loop")
                continue
            p50 = statistics.median(r.percentile(50) for r in tries)
            p99 = statistics.median(r.percentile(99) for r in tries)
            lag = max(r.behind_ms for r in tries)
            print(f"  {gw.name:<11}{rate:>6g}/s  p50 {p50:6.2f} (+{p50 - d50:5.2f})  p99 {p99:6.2f} (+{p99 - d99:5.2f})"
                  f"   direct p50 {d50:.2f} p99 {d99:.2f}{f'   (client behind by {lag:.0f} ms)' if lag > 5 else ''}")
            for figure, added in (("added_p50_ms", p50 - d50), ("added_p99_ms", p99 - d99)):
                rows.append({"bench": "peers", "case": f"{gw.name} open loop {rate:g}/s", "metric": figure,
                             "value": round(added, 3), "unit": "ms"})
    if idle_rss:
        print("\nresident memory, MB (every process of the gateway): idle / highest under load")
    for gw in gateways:
        if gw.name in idle_rss:
            print(f"  {gw.name:<11}{idle_rss[gw.name]:8.0f} / {load_rss.get(gw.name, float('nan')):8.0f}")
            rows += [{"bench": "peers", "case": f"{gw.name} memory", "metric": "idle_rss_mb",
                      "value": round(idle_rss[gw.name], 1), "unit": "MB"},
                     {"bench": "peers", "case": f"{gw.name} memory", "metric": "load_rss_mb",
                      "value": round(load_rss.get(gw.name, 0.0), 1), "unit": "MB"}]
    print("SUMMARY " + json.dumps(rows))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
