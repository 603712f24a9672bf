"""Extproc CPU per request of another checkout beside this one, in the same run.

For a change meant to make the request path cheaper: check the old commit out beside this tree
(`git worktree add /tmp/base HEAD~3`) and run

    .venv/bin/python bench/compare_revisions.py /tmp/base [--rounds 5] [--seconds 4] [--stream]

Four stacks run at once, each with its own Envoy and upstream: `minimal` and `demo` (as in
bench_gateway.py) for the other checkout's extproc (`base ...`) and for this tree's (`this ...`).
Rounds are interleaved, so a noisy neighbour hits every stack alike; each row is the median over
rounds of the extproc's CPU-time delta over a c=16 round divided by its 200s. Both extprocs share
this tree's venv, config and Envoy bootstrap; only the extproc's code differs. Any status other
than 200 fails the run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.bench_gateway import BODY, HEADERS, STREAM_BODY, _config, _pid  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.wrk_load import post_script, run_wrk  # noqa: E402
from contracts.config import parse_config  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Stack  # noqa: E402
from tests.conftest import UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, start_stack  # noqa: E402


def _stack(workdir: Path, config: str, code: Path | None) -> Stack:
    workdir.mkdir(parents=True)
    if config == "demo":
        data, _ = demo_config_free_ports()
        s = start_stack(workdir, data)
        s.quiet = True
    else:
        data = _config()
        (workdir / "modelyard.yaml").write_text(yaml.safe_dump(data))
        s = Stack(parse_config(data), EnvironmentConfig(name="bench", admin=None, concurrency=1),
                  config_path=workdir / "modelyard.yaml", workdir=workdir, quiet=True)
    if code is not None:  # the other checkout's modules shadow this tree's in its extproc
        s.child("extproc").cwd = code
        s.child("extproc").env = {"PYTHONPATH": str(code)}
    return s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("base", type=Path, help="the other checkout (a git worktree)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--stream", action="store_true", help="the ~100-chunk SSE stream instead of the unary call")
    a = p.parse_args(argv)
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    work = scratch.folder("bench-revs-")
    script = work / "post.lua"
    script.write_text(post_script(STREAM_BODY if a.stream else BODY, HEADERS))
    stacks = {f"{who} {config}": _stack(work / f"{who}-{config}", config, code)
              for config in ("minimal", "demo") for who, code in (("base", a.base.resolve()), ("this", None))}
    tallies: list[Tally] = []
    cpu: dict[str, list[float]] = {}
    with contextlib.ExitStack() as running:
        for s in stacks.values():
            running.enter_context(s)
        for label, s in stacks.items():
            tallies.append(Tally("revisions", f"{label} warm-up"))
            run_wrk(f"{s.url}/v1/chat/completions", 4, 1.0, script, tallies[-1])
        for i in range(a.rounds):
            for label, s in stacks.items():
                pid = _pid(s, "extproc")
                before = cpu_seconds(pid)
                tallies.append(Tally("revisions", f"{label} round {i + 1}"))
                run_wrk(f"{s.url}/v1/chat/completions", 16, a.seconds, script, tallies[-1])
                if tallies[-1].ok:
                    cpu.setdefault(label, []).append((cpu_seconds(pid) - before) / tallies[-1].ok * 1e6)
    print(f"extproc CPU per 200 at c=16 (us, median of {a.rounds} rounds); base is {a.base}")
    for config in ("minimal", "demo"):
        base, this = (statistics.median(cpu.get(f"{w} {config}", [float("nan")])) for w in ("base", "this"))
        print(f"  {config:<8} base {base:7.0f}  this {this:7.0f}  this/base {this / base:.2f}")
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
