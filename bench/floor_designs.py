"""The floors of the unary designs side by side, in one run: buffered bodies (4 messages), buffered
with the response headers skipped (3) and full-duplex bodies (`extproc.bodies: duplex`).

A do-nothing ext_proc (bench/floor_extproc.py) behind Modelyard's Envoy config three times: buffered as
rendered (request headers, request body, response headers, response body, each answered before the
next), with the response headers skipped (the design issue 26 asks about: status from `response.code`,
headers set at request time), and duplex (each body sent behind its headers, the headers answered
once it has come: two waits). Interleaved rounds: CPU per request (Envoy + extproc) at c=16, ext_proc
messages per request from Envoy's stats, p50 at one connection. docs/performance.md has the figures.

    .venv/bin/python bench/floor_designs.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (  # noqa: E402
    ExternalProcessor,
    ProcessingModeHeaderSendMode,
)
from envoy_data_plane.google.protobuf import Any as AnyMsg  # noqa: E402

from bench import scratch  # noqa: E402
from bench.bench_gateway import BODY, HEADERS, _floor_stack, _pid, extproc_stats  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.wrk_load import post_script, run_wrk  # noqa: E402
from controlplane import bootstrap  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Stack  # noqa: E402
from tests.conftest import UPSTREAM_KEYS  # noqa: E402

_RENDERED = bootstrap._ext_proc_filter


def _skipping_response_headers(*args: Any, **kwargs: Any) -> Any:
    """The rendered ext_proc filter with `response_header_mode: SKIP`."""
    f = _RENDERED(*args, **kwargs)
    assert f.typed_config is not None
    ext = ExternalProcessor.parse(f.typed_config.value)
    assert ext.processing_mode is not None
    ext.processing_mode.response_header_mode = ProcessingModeHeaderSendMode.SKIP
    f.typed_config = AnyMsg.pack(ext)
    return f


def floor_bench(argv: list[str] | None, prefix: str) -> tuple[argparse.Namespace, Path, EnvironmentConfig]:
    """The floor scripts' common start: `--rounds`, the demo keys, a work dir and the environment."""
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    for k, v in UPSTREAM_KEYS.items():
        os.environ.setdefault(k, v)
    work = scratch.folder(prefix)
    return a, work, EnvironmentConfig(name="bench", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)


@dataclass
class FloorRounds:
    """Per stack, one figure a round: Envoy's and the extproc's CPU per request at c=16, p50 at c=1."""

    envoy: dict[str, list[float]] = field(default_factory=dict)
    extproc: dict[str, list[float]] = field(default_factory=dict)
    p50: dict[str, list[float]] = field(default_factory=dict)
    p99_c16: dict[str, list[float]] = field(default_factory=dict)
    tallies: list[Tally] = field(default_factory=list)


def floor_rounds(bench: str, stacks: dict[str, Stack], script: Path, rounds: int, *,
                 one_connection: bool = False) -> FloorRounds:
    """Warm each started stack up, then `rounds` interleaved rounds of 3 s at c=16 (and of 2 s at one
    connection with `one_connection`): the floor scripts' measure."""
    out = FloorRounds()
    for name, s in stacks.items():
        out.tallies.append(Tally(bench, f"{name} warm-up"))
        run_wrk(f"{s.url}/v1/chat/completions", 4, 1, script, out.tallies[-1])
    for i in range(rounds):
        for name, s in stacks.items():
            pe, px = _pid(s, "envoy"), _pid(s, "extproc")
            before_e, before_x = cpu_seconds(pe), cpu_seconds(px)
            out.tallies.append(Tally(bench, f"{name} c=16 round {i + 1}"))
            run = run_wrk(f"{s.url}/v1/chat/completions", 16, 3, script, out.tallies[-1])
            out.p99_c16.setdefault(name, []).append(run.p99_ms)
            if run.tally.ok:
                out.envoy.setdefault(name, []).append((cpu_seconds(pe) - before_e) / run.tally.ok * 1e6)
                out.extproc.setdefault(name, []).append((cpu_seconds(px) - before_x) / run.tally.ok * 1e6)
            if one_connection:
                out.tallies.append(Tally(bench, f"{name} c=1 round {i + 1}"))
                out.p50.setdefault(name, []).append(
                    run_wrk(f"{s.url}/v1/chat/completions", 1, 2, script, out.tallies[-1]).p50_ms)
    return out


def run_floor_rounds(bench: str, stacks: dict[str, Stack], work: Path, rounds: int) -> FloorRounds:
    """Start `stacks`, measure them with `floor_rounds` (one connection too) on the bench's call, stop them."""
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    for s in stacks.values():
        s.start()
    try:
        return floor_rounds(bench, stacks, script, rounds, one_connection=True)
    finally:
        for s in stacks.values():
            s.stop()


@contextlib.contextmanager
def skipping_response_headers(stack: Stack) -> Iterator[None]:
    """Run `stack` with its Envoy rendered with `response_header_mode: SKIP` (rendered at start)."""
    bootstrap._ext_proc_filter = _skipping_response_headers
    try:
        stack.start()
    finally:
        bootstrap._ext_proc_filter = _RENDERED
    try:
        yield
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    a, work, env = floor_bench(argv, "floor-designs-")
    stacks = {"4 messages": _floor_stack(work / "four", env, bodies="buffered"),
              "3 messages": _floor_stack(work / "three", env, bodies="buffered"),
              "duplex": _floor_stack(work / "duplex", env)}
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    tallies: list[Tally] = []
    cpu: dict[str, list[float]] = {}
    msgs: dict[str, list[float]] = {}
    p50: dict[str, list[float]] = {}
    with stacks["4 messages"], skipping_response_headers(stacks["3 messages"]), stacks["duplex"]:
        for name, s in stacks.items():
            tallies.append(Tally("floor-designs", f"{name} warm-up"))
            run_wrk(f"{s.url}/v1/chat/completions", 4, 1, script, tallies[-1])
        for i in range(a.rounds):
            for name, s in stacks.items():
                url = f"{s.url}/v1/chat/completions"
                tallies.append(Tally("floor-designs", f"{name} c=1 round {i + 1}"))
                p50.setdefault(name, []).append(run_wrk(url, 1, 2, script, tallies[-1]).p50_ms)
                pids = [_pid(s, "extproc"), _pid(s, "envoy")]
                stats, before = extproc_stats(s), sum(cpu_seconds(pid) for pid in pids)
                tallies.append(Tally("floor-designs", f"{name} c=16 round {i + 1}"))
                run = run_wrk(url, 16, 3, script, tallies[-1])
                used, after = sum(cpu_seconds(pid) for pid in pids) - before, extproc_stats(s)
                if run.tally.ok:
                    cpu.setdefault(name, []).append(used / run.tally.ok * 1e6)
                streams = after["streams_started"] - stats["streams_started"]
                if streams:
                    msgs.setdefault(name, []).append((after["stream_msgs_sent"] - stats["stream_msgs_sent"]) / streams)
    for name in stacks:
        print(f"{name}: Envoy + extproc CPU {statistics.median(cpu[name]):.0f} us/req (rounds "
              f"{', '.join(f'{x:.0f}' for x in cpu[name])}), {statistics.median(msgs[name]):.2f} ext_proc messages "
              f"per request, p50 at c=1 {statistics.median(p50[name]):.2f} ms")
    for name in ("3 messages", "duplex"):
        print(f"{name} / 4 messages: CPU {statistics.median(cpu[name]) / statistics.median(cpu['4 messages']):.3f}, "
              f"c=1 p50 {statistics.median(p50[name]) / statistics.median(p50['4 messages']):.3f}")
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
