"""What the per-deployment queues cost a request.

In process: the pure queue (`DeploymentQueue`: offer + release) and the async shell
(`ConcurrencyLimits`: acquire + release, waking the next waiter), on a free slot and with a
contended queue of 1,000 waiters across 10 tenants and 3 tiers.

Through Envoy (when wrk is installed): three models on three demo upstreams, no limit,
`max_inflight: 64` (a slot always free) and `max_inflight: 4` (16 connections: 12 always wait in the
extproc), loaded in turn by wrk at 16 connections. The figure is the extproc's CPU time per
completed request (its /proc utime + stime delta over the 200s), steadier on a shared machine than req/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from bench.wrk_load import post_script, run_wrk  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from contracts.config.queueing import QueueSettings  # noqa: E402
from contracts.config.service_levels import Tier  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Stack  # noqa: E402
from extproc.admission.concurrency import ConcurrencyLimits  # noqa: E402
from extproc.routing.queueing import DeploymentQueue, Ticket  # noqa: E402
from tests.stack_config import free_port  # noqa: E402

KEY_DIGEST = "sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"  # sk-modelyard-demo
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-modelyard-demo"}
TIERS: tuple[Tier, ...] = ("L1", "L2", "L3")
BIG = QueueSettings(bound=100_000, tenant_share=1.0)


def _per_request_us(fn, n: int, rounds: int = 5) -> float:
    """Median over rounds of the mean time per call."""
    out = []
    n = scaled(n, max(16, n // 100))
    for _ in range(scaled(rounds, 1)):
        t0 = time.perf_counter_ns()
        fn(n)
        out.append((time.perf_counter_ns() - t0) / n / 1000)
    return statistics.median(out)


def pure_free(n: int) -> None:
    q = DeploymentQueue(4, BIG)
    for _ in range(n):
        t = Ticket("a", "L3", 0.0)
        q.offer(t, 0.0)
        q.release(t, 0.0)


def pure_contended(n: int) -> None:
    """1,000 waiters stay queued; each round one more arrives and the oldest slot frees."""
    q = DeploymentQueue(4, BIG)
    held = []
    for i in range(1004):
        t = Ticket(f"t{i % 10}", TIERS[i % 3], 0.0)
        q.offer(t, 0.0)
        if t.state == "granted":
            held.append(t)
    for i in range(n):
        q.offer(Ticket(f"t{i % 10}", TIERS[i % 3], 0.0), 0.0)
        nxt = q.release(held.pop(0), 0.0)
        assert nxt is not None
        held.append(nxt)


def _limits(max_inflight: int) -> ConcurrencyLimits:
    cfg = parse_config({"models": [{"name": "m", "deployments": [
        {"cluster": "c", "protocol": "openai", "endpoints": ["127.0.0.1:9"], "max_inflight": max_inflight,
         "queue": {"bound": 100_000, "tenant_share": 1.0, "max_wait_s": 600}},
        {"cluster": "free", "protocol": "openai", "endpoints": ["127.0.0.1:9"]}]}],
        "tenants": [{"name": "t", "api_keys": [KEY_DIGEST]}]})
    return ConcurrencyLimits(cfg)


def shell_case(cluster: str, max_inflight: int, callers: int):
    """`callers` tasks each acquire, yield once (the request in flight) and release, n times in all."""
    def run(n: int) -> None:
        async def main() -> None:
            limits = _limits(max_inflight)
            per = n // callers

            async def caller(i: int) -> None:
                for _ in range(per):
                    slot = await limits.acquire(cluster, "m", f"t{i % 10}", TIERS[i % 3])
                    await asyncio.sleep(0)
                    if slot is not None:
                        slot.release()

            await asyncio.gather(*(caller(i) for i in range(callers)))
        asyncio.run(main())
    return run


def in_process() -> list[dict]:
    rows = []
    print(f"{'in process':<40} {'us/request':>10}")
    base = _per_request_us(shell_case("free", 1, 1), 20_000)
    cases = [
        ("pure: free slot", "pure-free", _per_request_us(pure_free, 200_000), None),
        ("pure: 1,000 waiting", "pure-contended", _per_request_us(pure_contended, 50_000), None),
        ("shell: no limit (baseline)", "shell-unlimited", base, None),
        ("shell: free slot", "shell-free", _per_request_us(shell_case("c", 64, 1), 20_000), base),
        ("shell: 1 slot, 16 callers wait in turn", "shell-queued",
         _per_request_us(shell_case("c", 1, 16), 20_000), _per_request_us(shell_case("free", 1, 16), 20_000)),
    ]
    for label, case, us, baseline in cases:
        print(f"{label:<40} {us:>10.2f}" + (f"   (no limit: {baseline:.2f})" if baseline else ""))
        row = {"bench": "queueing", "case": case, "metric": "per_request", "value": round(us, 3), "unit": "us"}
        if baseline:
            row.update(baseline=round(baseline, 3), ratio=round(us / baseline, 3))
        rows.append(row)
    return rows




def through_envoy(seconds: float, rounds: int, tallies: list[Tally]) -> list[dict]:
    cases = {"plain": None, "free-slots": 64, "queued": 4}
    clusters = {name: f"demo-bench-{name}" for name in cases}
    models = [{"name": f"bench-{name}", "deployments": [
        {"cluster": clusters[name], "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"],
         **({"max_inflight": limit, "queue": {"bound": 256, "tenant_share": 1.0}} if limit else {})}]}
        for name, limit in cases.items()]
    data = {"listener": {"address": "127.0.0.1", "port": free_port()},
            "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}"},
            "models": models, "tenants": [{"name": "bench", "tier": "L1", "api_keys": [KEY_DIGEST]}],
            # `modelyard up` starts only the demo upstreams a config declares (none by its cluster's name).
            "devstack": {"demo_upstreams": list(clusters.values())}}
    work = scratch.folder("bench-queue-")
    cfg_path = work / "modelyard.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    scripts = {}
    for name in cases:
        scripts[name] = work / f"{name}.lua"
        body = json.dumps({"model": f"bench-{name}", "messages": [{"role": "user", "content": "queue bench"}]})
        scripts[name].write_text(post_script(body, HEADERS))
    stack = Stack(parse_config(data), EnvironmentConfig(name="bench", admin=None, concurrency=1),
                  config_path=cfg_path, workdir=work, quiet=True)
    per_case: dict[str, list[float]] = {name: [] for name in cases}
    with stack:
        extproc = stack.child("extproc").proc
        if extproc is None:  # the stack starts every child on entry
            raise SystemExit("queueing: the stack's extproc did not start")
        pid = extproc.pid
        url = f"{stack.url}/v1/chat/completions"
        for name in () if SMOKE else cases:  # a smoke run's one round runs the same path
            tallies.append(Tally("queueing", f"{name} warm-up"))
            run_wrk(url, 4, 1.0, scripts[name], tallies[-1])
        for i in range(rounds):
            for name in cases:
                tallies.append(Tally("queueing", f"{name} c=16 round {i + 1}"))
                cpu0 = cpu_seconds(pid)
                result = run_wrk(url, 16, seconds, scripts[name], tallies[-1])
                ok = result.tally.ok
                if ok:
                    per_case[name].append((cpu_seconds(pid) - cpu0) / ok * 1e6)
    rows = []
    print(f"\n{'through Envoy, c=16':<40} {'extproc CPU us/request':>22}")
    base = statistics.median(per_case["plain"]) if per_case["plain"] else float("nan")
    for name, samples in per_case.items():
        if not samples:
            continue
        us = statistics.median(samples)
        print(f"{name:<40} {us:>22.0f}" + (f"   ({us - base:+.0f} us against no limit)" if name != "plain" else ""))
        row = {"bench": "queueing", "case": f"envoy {name} c=16", "metric": "extproc_cpu", "value": round(us, 1),
               "unit": "us/req"}
        if name != "plain":
            row.update(baseline=round(base, 1), ratio=round(us / base, 3))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=scaled(4.0, 1.0))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    p.add_argument("--in-process-only", action="store_true")
    a = p.parse_args(argv)
    rows = in_process()
    tallies: list[Tally] = []
    if a.in_process_only or not shutil.which("wrk"):
        print("through Envoy: skipped" + ("" if a.in_process_only else " (wrk is not installed)"))
    else:
        rows += through_envoy(a.seconds, a.rounds, tallies)
    print("SUMMARY " + json.dumps(rows))
    return report(tallies) if tallies else 0


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
