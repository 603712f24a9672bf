"""What a microsecond of work per message costs the whole gateway, in one run.

The do-nothing ext_proc (bench/floor_extproc.py) behind the same Envoy config, once as it is and
once per `--work` level with that much busy CPU per message before each reply (spent on the thread's
own clock, so it is exactly that much of the loop thread's CPU). Interleaved rounds: Envoy's and the
extproc's CPU per request at c=16 and p50 at one connection; then the amplification, the gateway
CPU added per request over the CPU the work itself took (four messages x the work). In-process
benches (bench_session.py) measure the session's own CPU; this says what each of its microseconds
costs live. docs/performance.md has the figures.

    .venv/bin/python bench/floor_work.py [--rounds 5] [--work 30,60,a60]

A level `a60` spends its work after each reply's write instead of before it: what work that the
reply does not wait for costs, at c=16 and at one connection.
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
from bench.outcomes import report  # noqa: E402

MESSAGES = 4  # a unary call's ext_proc messages (request headers and body, response headers and body)


def _level(spec: str) -> tuple[float, bool]:
    """`60`: 60 us before each reply; `a60`: 60 us after each reply's write."""
    return float(spec.removeprefix("a")), spec.startswith("a")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    levels = ["0"]
    if "--work" in argv:
        i = argv.index("--work")
        levels += argv[i + 1].split(",")
        del argv[i:i + 2]
    else:
        levels += ["30", "60"]
    a, work, env = floor_bench(argv, "floor-work-")
    stacks = {}
    for spec in levels:
        us, after = _level(spec)
        s = _floor_stack(work / f"work-{spec}", env, bodies="buffered")  # MESSAGES: the buffered design's
        s.child("extproc").argv += ["--after-us" if after else "--work-us", str(us)]
        stacks[spec] = s
    got = run_floor_rounds("floor-work", stacks, work, a.rounds)
    envoy, extproc, p50, tallies = got.envoy, got.extproc, got.p50, got.tallies
    base = statistics.median(envoy["0"]) + statistics.median(extproc["0"])
    base_p50 = statistics.median(p50["0"])
    rows = []
    for spec in levels:
        us, after = _level(spec)
        e, x, lat = statistics.median(envoy[spec]), statistics.median(extproc[spec]), statistics.median(p50[spec])
        added = MESSAGES * us
        amp = f"{(e + x - base) / added:.2f}x" if added else "-"
        where = "after " if after else "before"
        print(f"work {us:5.0f} us/message {where}  Envoy {e:6.0f} + extproc {x:6.0f} = {e + x:6.0f} us/req "
              f"(+{e + x - base:5.0f} for {added:4.0f} us of work: {amp})  c=1 p50 {lat:.2f} ms (+{lat - base_p50:.2f})")
        rows.append({"bench": "floor-work", "case": f"work {us:g} us/message {where.strip()} the reply",
                     "metric": "cpu_us", "value": round(e + x, 1), "unit": "us/req", "baseline": round(base, 1),
                     "ratio": round((e + x) / base, 3)})
    print("SUMMARY " + json.dumps(rows))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
