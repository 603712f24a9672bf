"""The do-nothing floor on each server of the extproc's Unix socket, grpc.aio against h2, in one run.

The same floor ext_proc (bench/floor_extproc.py) behind the same Envoy, reached over a Unix socket
served by grpc.aio (grpc core's poller and event-engine threads hand each message to the loop) or
straight on h2 by the extproc's own server (extproc/h2_grpc.py: HTTP/2 parsed on the loop's thread).
With `--work 60` each also runs with 60 us of busy CPU per message, so the amplification (gateway CPU
added per microsecond of extproc work, bench/floor_work.py) is read per server.
Interleaved rounds: Envoy + extproc CPU per request and p99 at c=16, p50 at one connection.
docs/performance.md ("Issue 38, eighth pass" and "ninth pass") has the figures.

    .venv/bin/python bench/floor_servers.py [--rounds 5] [--work 60]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scratch  # noqa: E402
from bench.bench_gateway import _floor_stack  # noqa: E402
from bench.floor_designs import floor_bench, run_floor_rounds  # noqa: E402
from bench.floor_work import MESSAGES  # noqa: E402
from bench.outcomes import report  # noqa: E402

SERVERS = ("grpcio", "h2")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    work_us = 0.0
    if "--work" in argv:
        i = argv.index("--work")
        work_us = float(argv[i + 1])
        del argv[i:i + 2]
    a, work, env = floor_bench(argv, "floor-servers-")
    stacks = {}
    for server in SERVERS:
        stacks[server] = _floor_stack(work / server, env, socket_server=server, bodies="buffered")
        if work_us:
            s = _floor_stack(work / f"{server}-work", env, socket_server=server, bodies="buffered")
            s.child("extproc").argv += ["--work-us", str(work_us)]
            stacks[f"{server}+{work_us:g}us"] = s
    got = run_floor_rounds("floor-servers", stacks, work, a.rounds)
    med = statistics.median
    cpu = {n: med(got.envoy[n]) + med(got.extproc[n]) for n in stacks}
    rows = []
    for name in stacks:
        server = name.partition("+")[0]
        amp = ""
        if name != server:
            amp = f"  amplification {(cpu[name] - cpu[server]) / (MESSAGES * work_us):.2f}x"
        print(f"{name:16} Envoy {med(got.envoy[name]):5.0f} + extproc {med(got.extproc[name]):5.0f} = "
              f"{cpu[name]:5.0f} us/req at c=16, p99 {med(got.p99_c16[name]):6.2f} ms; c=1 p50 "
              f"{med(got.p50[name]):.2f} ms{amp}  (rounds: extproc "
              f"{'/'.join(f'{x:.0f}' for x in got.extproc[name])}, p50 {'/'.join(f'{x:.2f}' for x in got.p50[name])})")
    for name in stacks:
        if name.startswith("h2"):
            base = name.replace("h2", "grpcio")
            for metric, value, ref in (("cpu_us", cpu[name], cpu[base]),
                                       ("p50_ms", med(got.p50[name]), med(got.p50[base]))):
                rows.append({"bench": "floor-servers", "case": f"{name} vs {base}", "metric": metric,
                             "value": round(value, 2), "baseline": round(ref, 2), "ratio": round(value / ref, 3)})
    print("SUMMARY " + json.dumps(rows))
    return report(got.tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
