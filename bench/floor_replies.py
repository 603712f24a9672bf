"""What Modelyard's replies cost Envoy and grpc, apart from the session that builds them, in one run.

The do-nothing ext_proc (bench/floor_extproc.py) three times behind the same Envoy config: with its
own bare replies; with the header mutations Modelyard's request-side replies carry for a unary
OpenAI call under the shipped config (request headers: 4 removals; request body: 6 sets and 8
removals besides the cluster header); and with those plus the response-headers reply's 6 public
headers and 2 removals. All prebuilt, so the extproc's work stays the floor's: the difference is
what carrying and applying Modelyard-shaped replies costs. Interleaved rounds at c=16, medians of
Envoy's and the extproc's CPU per request. docs/performance.md has the figures.

    .venv/bin/python bench/floor_replies.py [--rounds 5]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import scratch  # noqa: E402
from bench.bench_gateway import BODY, HEADERS, _floor_stack  # noqa: E402
from bench.floor_designs import floor_bench, floor_rounds  # noqa: E402
from bench.outcomes import report  # noqa: E402
from bench.wrk_load import post_script  # noqa: E402

SHAPES = ("floor", "request-side", "modelyard")


def main(argv: list[str] | None = None) -> int:
    a, work, env = floor_bench(argv, "floor-replies-")
    stacks = {}
    for shape in SHAPES:
        s = _floor_stack(work / shape, env, bodies="buffered")
        s.child("extproc").argv += ["--replies", shape, "--body-length", str(len(BODY))]
        stacks[shape] = s
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    for s in stacks.values():
        s.start()
    try:
        got = floor_rounds("floor-replies", stacks, script, a.rounds)
    finally:
        for s in stacks.values():
            s.stop()
    envoy, extproc, tallies = got.envoy, got.extproc, got.tallies
    base_e, base_x = statistics.median(envoy["floor"]), statistics.median(extproc["floor"])
    for shape in SHAPES:
        e, x = statistics.median(envoy[shape]), statistics.median(extproc[shape])
        print(f"{shape:<13} Envoy {e:6.0f} us/req ({e / base_e:.2f}x)  extproc {x:6.0f} us/req ({x / base_x:.2f}x)  "
              f"Envoy rounds {', '.join(f'{v:.0f}' for v in envoy[shape])}")
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
