"""Which replica: Modelyard's replica picker against Envoy's balancers and the Rust routers, on one
simulated fleet (issue 40).

    .venv/bin/python bench/bench_replicas.py [--rates 6,12,24] [--duration 20] [--rounds 1]
        [--replicas 4] [--routers-venv .peers/routers] [--strategies picker,least_request,...]

One fleet of simulated vLLM-like servers (devstack/fleet: continuous batching, prefix cache,
KV-bounded batch, preemption, vLLM's /metrics) and one Modelyard stack (real Envoy, extproc) in
front of it with three models on the same replicas: `fleet-picker` (replica_metrics: the picker,
Envoy's override-host), `fleet-lr` (lb least_request) and `fleet-rr` (lb round_robin), rendered
by the control plane's balancing config as any deployment. The Rust routers, where
`make bench-routers` installed them (`vllm-router`, `sglang-router` from PyPI, each with its
prefix-aware `cache_aware` policy), run in front of the same replicas without Envoy.

Every strategy gets the same open-loop workload (bench/fleet_load.py: shared system prompts,
multi-turn conversations, uneven prompt and answer lengths; the same seed, so the same prompts)
at each rate, the fleet emptied (caches, counters) before each run. Then, where `make
bench-routers` installed it, the same again driven by `inference-perf` (the Inference Extension's
own benchmark client, bench/fleet_inference_perf.py: its shared_prefix workload, sent as
/v1/completions) at the saturation rate (`--ip-rates`); `--client builtin|inference-perf|both`. Reported per strategy and
rate: TTFT p50/p99, output tokens/s (over the wall, and `steady`: while arrivals last, past their
first quarter), preemptions, prefix-cache hit share, and for the picker the share of its picks that
found no fresh reading (Envoy balanced those). bench_fleet_sim.py runs the same fleet, workload and
picker in simulated time, without the box's noise. Strategies are
interleaved within a round, so a noisy neighbour on the box hits them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import (
    fleet_inference_perf,  # noqa: E402
    scratch,  # noqa: E402
)
from bench.fleet_load import WorkloadSpec, open_loop, pct  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from tests.stack_config import free_port, small_config, start_stack  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-modelyard-demo"
ENVOY = {"picker": "fleet-picker", "least_request": "fleet-lr", "round_robin": "fleet-rr"}
ROUTERS = ("vllm-router", "sglang-router")
# The fleet: a replica's decode step is 20 ms + 1 ms per running request, prefill 0.08 ms per
# uncached prompt token, 1,536 KV blocks of 16 tokens (24,576 tokens: about three of the
# workload's system prompts with their conversations, so where a prompt goes matters).
FLEET_ARGS = ["--kv-blocks", "1536", "--block-tokens", "16", "--max-running", "48", "--prefill-budget", "2048",
              "--decode-base-ms", "20", "--decode-ms-per-seq", "1", "--prefill-ms-per-token", "0.08",
              "--flush-ms", "250"]


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{what} not listening on {port} after {timeout}s")


def _fleet_config(endpoints: list[str], variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = small_config()
    rm: dict[str, Any] = {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 500}
    # completion: the fleet answers /v1/completions (inference-perf's shared_prefix data) as sent.
    common = {"task_types": ["chat", "completion"], "capabilities": {"context_window": 65536, "max_output_tokens": 4096}}

    def dep(cluster: str, **extra: Any) -> dict[str, Any]:
        # A stream at saturation can wait long in a replica's queue: no gateway timeout cuts it first.
        return {"cluster": cluster, "protocol": "openai", "endpoints": endpoints, "timeout_ms": 600_000,
                "upstream_model": "sim-llama", **extra}

    data["models"] = [
        {"name": "fleet-picker", **common, "deployments": [dep("fleet-picker", replica_metrics=rm)]},
        {"name": "fleet-lr", **common, "deployments": [dep("fleet-lr", lb={"policy": "least_request"})]},
        {"name": "fleet-rr", **common, "deployments": [dep("fleet-rr", lb={"policy": "round_robin"})]},
    ]
    # Picker variants (other replica_metrics settings), each its own model on the same replicas.
    for name, over in variants.items():
        data["models"].append({"name": f"fleet-picker-{name}", **common,
                               "deployments": [dep(f"fleet-picker-{name}", replica_metrics={**rm, **over})]})
    return data


class Routers:
    """The Rust routers installed by `make bench-routers`, each on its own port, or why not."""

    def __init__(self, venv: Path, endpoints: list[str], wanted: list[str], logs: Path) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}
        self.missing: dict[str, str] = {}
        urls = [f"http://{e}" for e in endpoints]
        for name in ROUTERS:
            if name not in wanted:
                continue
            py = venv / "bin" / "python"
            module = "vllm_router.launch_router" if name == "vllm-router" else "sglang_router.launch_router"
            if not py.exists():
                self.missing[name] = f"not installed ({venv}: run make bench-routers)"
                continue
            port = free_port()
            cmd = [str(py), "-m", module, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
                   "--policy", "cache_aware", "--prometheus-port", str(free_port()), "--log-level", "warning" if
                   name == "vllm-router" else "warn"]
            log = open(logs / f"{name}.log", "wb")  # noqa: SIM115
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.ports[name] = port
        for name, proc in list(self.procs.items()):
            try:
                _wait_port(self.ports[name], proc, name, 60)
                self._ready(name)
            except RuntimeError as e:
                self.missing[name] = str(e)
                proc.kill()
                del self.procs[name]

    def _ready(self, name: str) -> None:
        """Until a call through it answers (the routers register workers after they listen)."""
        deadline = time.monotonic() + 60
        body = {"model": "sim-llama", "messages": [{"role": "user", "content": "ready?"}], "max_tokens": 1}
        while True:
            try:
                r = httpx.post(f"http://127.0.0.1:{self.ports[name]}/v1/chat/completions", json=body, timeout=10)
                if r.status_code == 200:
                    return
                why = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as e:
                why = repr(e)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} never answered: {why}")
            time.sleep(0.5)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def _fleet_stats(endpoints: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"http://{e}/stats", timeout=10).json() for e in endpoints]


def _reset(endpoints: list[str]) -> None:
    deadline = time.monotonic() + 60
    for e in endpoints:
        while httpx.post(f"http://{e}/reset", timeout=10).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{e} never went idle")
            time.sleep(0.2)


class Tracer:
    """Samples every replica's queue and KV cache (the fleet's GET /state) every `every_s` in a
    thread, for `--trace`: where a run's tail is spent, replica by replica."""

    def __init__(self, endpoints: list[str], every_s: float) -> None:
        self.endpoints, self.every_s = endpoints, every_s
        self.samples: list[list[Any]] = []  # [seconds since start, [[running, waiting, kv], ...]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Tracer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        t0 = time.monotonic()
        with httpx.Client(timeout=5) as http:
            while not self._stop.wait(self.every_s):
                try:
                    states = [http.get(f"http://{e}/state").json() for e in self.endpoints]
                except httpx.HTTPError:
                    continue
                self.samples.append([round(time.monotonic() - t0, 2),
                                     [[s["running"], s["waiting"], round(s["kv_usage"], 3)] for s in states]])


def tail_balance(samples: list[list[Any]]) -> dict[str, float]:
    """From a trace: the share of sampled time some replica sat idle while another had calls waiting
    (balance lost), and how far apart the replicas' last busy samples were (the drain's spread)."""
    if not samples:
        return {"idle_while_waiting": 0.0, "drain_spread_s": 0.0}
    lost = sum(1 for _, reps in samples if any(r + w == 0 for r, w, _ in reps) and any(w > 0 for _, w, _ in reps))
    last = [max((t for t, reps in samples if reps[i][0] + reps[i][1] > 0), default=0.0)
            for i in range(len(samples[0][1]))]
    return {"idle_while_waiting": lost / len(samples), "drain_spread_s": max(last) - min(last)}


def _run(name: str, url: str, model: str, rate: float, duration: float, seed: int, endpoints: list[str],
         headers: dict[str, str], gateway_pids: list[int], ip: tuple[Path, Path, Path] | None,
         trace_s: float = 0.0) -> dict[str, Any]:
    _reset(endpoints)
    cpu0 = sum(_proc_cpu(p) for p in gateway_pids)
    time.sleep(0.3)  # a poll interval or more: the picker's readings show the empty fleet
    # Smoke: short answers, so each run drains in a second or two.
    spec = scaled(WorkloadSpec(), WorkloadSpec(output_tokens=(4, 8, 16)))
    tracer = Tracer(endpoints, trace_s) if trace_s else contextlib.nullcontext()
    with tracer:
        if ip is not None:
            venv, tok, work = ip
            key = headers.get("authorization", "").removeprefix("Bearer ") or None
            s = fleet_inference_perf.run(venv, tok, work, url.removesuffix("/v1/chat/completions"), model, key,
                                         rate, duration, seed)
        else:
            s = asyncio.run(open_loop(url, model, rate, duration, seed, spec, headers)).summary()
    if isinstance(tracer, Tracer):
        s["trace"] = tracer.samples
        s.update(tail_balance(tracer.samples))
    # The gateway's own CPU (extproc and Envoy) for calls through it: it must not be what saturates.
    s["gateway_cpu_share"] = (sum(_proc_cpu(p) for p in gateway_pids) - cpu0) / s["wall_s"] if gateway_pids else 0.0
    stats = _fleet_stats(endpoints)
    s["preemptions"] = sum(x["preemptions"] for x in stats)
    q = sum(x["prefix_queries"] for x in stats)
    s["prefix_hit_share"] = sum(x["prefix_hits"] for x in stats) / q if q else 0.0
    s["fleet_busy_s"] = sum(x["busy_s"] for x in stats)
    s["fleet_cpu_s"] = sum(x["cpu_s"] for x in stats)
    s["fleet_late_s"] = sum(x.get("late_s", 0.0) for x in stats)  # the box's noise in the fleet's clock
    s["per_replica"] = [x["finished"] for x in stats]
    # TTFT at the replicas (arrival to first token, no network, no gateway): the routing's own effect,
    # which a busy box's CPU contention on the gateway or the client does not blur.
    at_fleet = sorted(t for x in stats for t in x["ttft_ms"])
    s["fleet_ttft_p50_ms"], s["fleet_ttft_p99_ms"] = pct(at_fleet, 50), pct(at_fleet, 99)
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default=scaled("6,12,24", "4"), help="arrivals per second, comma-separated")
    ap.add_argument("--duration", type=float, default=scaled(20.0, 2.0))  # 5 strategies x 3 rates: within run_all's 15 minutes
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--same-seed", action="store_true", help="every round the same workload (its variance is "
                    "then the box's and the system's, not the workload's)")
    ap.add_argument("--replicas", type=int, default=scaled(4, 2))
    ap.add_argument("--strategies", default=",".join([*ENVOY, *ROUTERS]))
    ap.add_argument("--routers-venv", default=str(ROOT / ".peers" / "routers"))
    ap.add_argument("--variants", default="", help="picker variants beside the shipped settings, run as "
                    "strategies picker:NAME: 'NAME=JSON;...' of replica_metrics keys, e.g. "
                    "'blocks64={\"prefix_blocks\": 64};noprefix={\"weights\": {\"prefix\": 0}}'")
    ap.add_argument("--fleet-args", default="", help="extra fleet arguments (override the defaults), e.g. "
                    "'--kv-blocks 1024'")
    ap.add_argument("--client", choices=["builtin", "inference-perf", "both"], default=scaled("both", "builtin"),
                    help="the load generator: bench/fleet_load.py's, inference-perf (its venv: "
                    "--inference-perf-venv, make bench-routers installs it), or both, one after the other "
                    "(inference-perf where installed); smoke mode: builtin unless asked")
    ap.add_argument("--inference-perf-venv", default=str(ROOT / ".peers" / "inference-perf"))
    # Each inference-perf run costs ~20 s of its own start-up: by default only at saturation (run_all's 15 minutes).
    ap.add_argument("--ip-rates", default=scaled("24", "4"), help="inference-perf's rates (default: saturation)")
    ap.add_argument("--json", default="", help="write every run's figures here")
    ap.add_argument("--trace", type=float, default=0.0, help="sample every replica's queue and KV cache this "
                    "often (seconds) during each run: into --json, and the tail's balance into the run's line")
    a = ap.parse_args(argv)
    rates = [float(r) for r in a.rates.split(",")]
    wanted = a.strategies.split(",")
    variants = {k: json.loads(v) for k, v in (x.split("=", 1) for x in a.variants.split(";") if x)}
    wanted += [f"picker:{k}" for k in variants]
    envoy = {**ENVOY, **{f"picker:{k}": f"fleet-picker-{k}" for k in variants}}

    ports = [free_port() for _ in range(a.replicas)]
    endpoints = [f"127.0.0.1:{p}" for p in ports]
    # The fleet's log (a router's HTTP/2 probe, say) stays out of the report; its tail shows if it dies.
    work = scratch.folder("bench-replicas-")
    fleet_log = open(work / "fleet.log", "wb")  # noqa: SIM115
    fleet = subprocess.Popen([sys.executable, "-m", "devstack.fleet.server", "--ports", ",".join(map(str, ports)),
                              *FLEET_ARGS, *a.fleet_args.split()], cwd=ROOT, stdout=fleet_log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    routers: Routers | None = None
    results: dict[tuple[str, str, float], list[dict[str, Any]]] = {}
    failed = False
    try:
        for p in ports:
            _wait_port(p, fleet, "fleet")
        fleet_cpu0 = _proc_cpu(fleet.pid)
        routers = Routers(Path(a.routers_venv), endpoints, wanted, work)
        for name, why in routers.missing.items():
            print(f"{name}: not run: {why}", flush=True)
        config = _fleet_config(endpoints, variants)
        picks_url = f"http://{config['extproc']['metrics_address']}/metrics"
        with tempfile.TemporaryDirectory() as tmp, start_stack(Path(tmp), config, demos=False) as stack:
            gw = [stack.child("extproc").proc.pid, stack.child("envoy").proc.pid]
            targets: list[tuple[str, str, str, dict[str, str], list[int]]] = []
            for name, model in envoy.items():
                if name in wanted:
                    targets.append((name, f"{stack.url}/v1/chat/completions", model,
                                    {"authorization": f"Bearer {KEY}"}, gw))
            for name, port in routers.ports.items():
                if name in routers.procs:
                    targets.append((name, f"http://127.0.0.1:{port}/v1/chat/completions", "sim-llama", {},
                                    [routers.procs[name].pid]))
            clients: list[tuple[str, tuple[Path, Path, Path] | None]] = []
            if a.client in ("builtin", "both"):
                clients.append(("builtin", None))
            ipv = Path(a.inference_perf_venv)
            if a.client == "inference-perf" or (a.client == "both" and (ipv / "bin" / "inference-perf").exists()):
                clients.append(("inference-perf", (ipv, fleet_inference_perf.tokenizer_dir(ipv, Path(tmp) / "tok"),
                                                   Path(tmp))))
            elif a.client == "both":
                print(f"inference-perf: not run: not installed ({ipv}: run make bench-routers)", flush=True)
            t0 = time.monotonic()
            for client, ip in clients:
                for rnd in range(a.rounds):
                    for rate in rates if ip is None else [float(r) for r in a.ip_rates.split(",")]:
                        for name, url, model, hdrs, pids in targets:
                            seed = (0 if a.same_seed else 1000 * rnd) + int(rate * 10)
                            picks0 = _picks(picks_url, model) if name.startswith("picker") else None
                            s = _run(name, url, model, rate, a.duration, seed, endpoints, hdrs, pids, ip, a.trace)
                            if picks0 is not None:
                                total, stale = (b - a for a, b in zip(picks0, _picks(picks_url, model)))
                                s["stale_pick_share"] = stale / total if total else math.nan
                            results.setdefault((client, name, rate), []).append(s)
                            if a.json:  # after every run: a long bench stopped half way keeps what it ran
                                _write_json(a.json, results)
                            print(f"{client} round {rnd} rate {rate:g}/s {name:<14} ok {s['ok']:>4}/{s['requests']:<4} "
                                  f"ttft p50 {s['ttft_p50_ms']:7.0f} ms p99 {s['ttft_p99_ms']:7.0f} ms "
                                  f"(at replicas {s['fleet_ttft_p50_ms']:5.0f} / {s['fleet_ttft_p99_ms']:6.0f})  "
                                  f"{s['output_tok_s']:6.0f} tok/s (steady {s.get('steady_tok_s', math.nan):5.0f})  preempt {s['preemptions']:4d}  "
                                  f"hits {s['prefix_hit_share']:.2f}  router CPU {s['gateway_cpu_share']:.0%}  "
                                  f"per replica {s['per_replica']}  wall {s['wall_s']:.1f} s  "
                                  f"fleet late {s['fleet_late_s']:.1f} s"
                                  + (f"  stale picks {s['stale_pick_share']:.1%}" if "stale_pick_share" in s else "")
                                  + (f"  idle-while-waiting {s['idle_while_waiting']:.0%} drain spread "
                                     f"{s['drain_spread_s']:.1f} s" if a.trace else ""), flush=True)
                            if s["errors"]:
                                print(f"FAILED: {name} at {rate:g}/s: {s['errors']} errors: {s['first_errors']}",
                                      flush=True)
                                failed = True
            bench_s = time.monotonic() - t0
        fleet_cpu = _proc_cpu(fleet.pid) - fleet_cpu0
    finally:
        if routers is not None:
            routers.close()
        fleet.terminate()
        fleet.wait(10)
    rows: list[dict[str, Any]] = []
    for client in dict.fromkeys(k[0] for k in results):
        mine = {(k[1], k[2]): v for k, v in results.items() if k[0] == client}
        print(f"\n== client: {client} (medians of {a.rounds} round(s))")
        rows += _report(mine, list(dict.fromkeys(k[1] for k in mine)),
                        [t for t in [*envoy, *ROUTERS] if any(k[0] == t for k in mine)],
                        "" if client == "builtin" else "ip:")
    print(f"\nfleet process CPU: {fleet_cpu:.1f} s over {bench_s:.0f} s of runs ({fleet_cpu / bench_s:.0%} of one core)")
    rows.append({"bench": "replicas", "case": "fleet-sim", "metric": "cpu_share", "value": round(fleet_cpu / bench_s, 3),
                 "unit": "cores"})
    if a.json:
        _write_json(a.json, results)
    print("SUMMARY " + json.dumps(rows))
    return 1 if failed else 0


def _write_json(path: str, results: dict[tuple[str, str, float], list[dict[str, Any]]]) -> None:
    Path(path).write_text(json.dumps({f"{k[0]}:{k[1]}@{k[2]:g}": v for k, v in results.items()}, indent=1))


def _picks(url: str, cluster: str) -> tuple[float, float]:
    """The extproc's replica picks for a cluster so far: (all, those where no reading was fresh and
    Envoy balanced), from modelyard_replica_picks_total."""
    total = stale = 0.0
    for line in httpx.get(url, timeout=10).text.splitlines():
        if line.startswith("modelyard_replica_picks_total{") and f'cluster="{cluster}"' in line:
            n = float(line.rsplit(" ", 1)[1])
            total += n
            stale += n if 'endpoint=""' in line else 0.0
    return total, stale


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _report(results: dict[tuple[str, float], list[dict[str, Any]]], rates: list[float],
            names: list[str], prefix: str = "") -> list[dict[str, Any]]:
    """The table (medians over rounds), the ratios the issue asks about, and the SUMMARY rows."""
    def med(name: str, rate: float, key: str) -> float:
        return statistics.median(r.get(key, math.nan) for r in results[(name, rate)])

    print(f"\n{'rate/s':>6} {'strategy':<14}{'TTFT p50 ms':>12}{'p99 ms':>9}{'replica p50':>12}{'p99':>7}"
          f"{'tok/s':>8}{'steady':>8}{'preempt':>9}{'hits':>6}")
    rows: list[dict[str, Any]] = []
    for rate in rates:
        for name in names:
            if (name, rate) not in results:
                continue
            p50, p99, tps = med(name, rate, "ttft_p50_ms"), med(name, rate, "ttft_p99_ms"), med(name, rate,
                                                                                               "output_tok_s")
            pre, hits = med(name, rate, "preemptions"), med(name, rate, "prefix_hit_share")
            sty = med(name, rate, "steady_tok_s")
            f50, f99 = med(name, rate, "fleet_ttft_p50_ms"), med(name, rate, "fleet_ttft_p99_ms")
            print(f"{rate:>6g} {name:<14}{p50:>12.0f}{p99:>9.0f}{f50:>12.0f}{f99:>7.0f}{tps:>8.0f}{sty:>8.0f}{pre:>9.0f}{hits:>6.2f}")
            base_p99 = med("least_request", rate, "ttft_p99_ms") if ("least_request", rate) in results else None
            base_tps = med("round_robin", rate, "output_tok_s") if ("round_robin", rate) in results else None
            base_sty = med("round_robin", rate, "steady_tok_s") if ("round_robin", rate) in results else None
            base_f99 = med("least_request", rate, "fleet_ttft_p99_ms") if ("least_request", rate) in results else None
            case = f"{prefix}{name}@{rate:g}"
            rows += [
                {"bench": "replicas", "case": case, "metric": "ttft_p50", "value": round(p50, 1), "unit": "ms"},
                {"bench": "replicas", "case": case, "metric": "ttft_p99", "value": round(p99, 1), "unit": "ms",
                 "ratio": round(p99 / base_p99, 3) if base_p99 else None},
                {"bench": "replicas", "case": case, "metric": "replica_ttft_p99", "value": round(f99, 1), "unit": "ms",
                 "ratio": round(f99 / base_f99, 3) if base_f99 else None},
                {"bench": "replicas", "case": case, "metric": "output_tok_s", "value": round(tps, 1),
                 "unit": "tok/s", "ratio": round(tps / base_tps, 3) if base_tps else None},
                {"bench": "replicas", "case": case, "metric": "preemptions", "value": pre, "unit": "count"},
            ]
            if not math.isnan(sty):  # inference-perf's runs have no steady-state rate
                rows.append({"bench": "replicas", "case": case, "metric": "steady_tok_s", "value": round(sty, 1),
                             "unit": "tok/s", "ratio": round(sty / base_sty, 3) if base_sty else None})
    if "picker" in names and "least_request" in names:
        print("\npicker vs least_request TTFT p99, and vs round_robin output tok/s, per rate:")
        for rate in rates:
            r99 = med("picker", rate, "ttft_p99_ms") / med("least_request", rate, "ttft_p99_ms")
            f99 = med("picker", rate, "fleet_ttft_p99_ms") / med("least_request", rate, "fleet_ttft_p99_ms")
            rt = (med("picker", rate, "output_tok_s") / med("round_robin", rate, "output_tok_s")
                  if "round_robin" in names else float("nan"))
            rs = (med("picker", rate, "steady_tok_s") / med("round_robin", rate, "steady_tok_s")
                  if "round_robin" in names else float("nan"))
            print(f"  {rate:g}/s: p99 x{r99:.2f} (at the replicas x{f99:.2f})   tok/s x{rt:.2f} (steady x{rs:.2f})")
    if SMOKE:
        print("(smoke mode: the figures mean nothing)")
    return rows


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
