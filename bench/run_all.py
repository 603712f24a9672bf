"""`make bench`: run every bench/bench_*.py and print one summary table from their SUMMARY lines.

A bench fails when it exits non-zero (the ones that send requests do so on any unexpected status
or transport error, printing `FAILED:` lines), prints no SUMMARY line, or runs past its timeout.
Every bench still runs; the exit status is 1 if any failed, and the failures are listed by name.

`--smoke` runs each bench's smoke mode (bench.smoke: the same code path, a second or two per
case; `make test` runs it through tests/bench/test_smoke.py); bench_peers smokes Modelyard and the
floor only (its peers are make bench-peers' installs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.smoke import ENV as SMOKE_ENV  # noqa: E402

TIMEOUT_S = 900
SMOKE_TIMEOUT_S = 300


@dataclass
class BenchRun:
    """One bench's run: its exit status (or "timed out after ..."), output and summary rows."""

    script: Path
    status: int | str
    out: str
    err: str
    rows: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failure(self) -> str | None:
        """`bench_x.py (exit 1)` and its FAILED lines, or None when it passed."""
        summary = [ln for ln in self.out.splitlines() if ln.startswith("SUMMARY ")]
        if self.status == 0 and summary:
            return None
        why = "no SUMMARY line" if self.status == 0 else f"exit {self.status}" if isinstance(self.status, int) \
            else self.status
        reasons = [ln for ln in self.out.splitlines() if ln.startswith("FAILED: ")]
        return f"{self.script.name} ({why})" + "".join(f"\n    {r}" for r in reasons)


def scripts() -> list[Path]:
    """The benches in run order: the gateway overhead first, the figure every other one sits on."""
    return sorted(HERE.glob("bench_*.py"), key=lambda p: (p.stem != "bench_gateway", p.stem))


def run_one(script: Path, smoke: bool = False) -> BenchRun:
    """Run one bench in a child process (in smoke mode with `smoke`)."""
    env = {**os.environ, SMOKE_ENV: "1"} if smoke else {k: v for k, v in os.environ.items() if k != SMOKE_ENV}
    timeout = SMOKE_TIMEOUT_S if smoke else TIMEOUT_S
    t = time.monotonic()
    # Its own process group: a bench past its timeout goes with the stacks it started, not just itself.
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return BenchRun(script, f"timed out after {timeout}s", out, err, seconds=time.monotonic() - t)
    run = BenchRun(script, proc.returncode, out, err, seconds=time.monotonic() - t)
    summary = [ln for ln in out.splitlines() if ln.startswith("SUMMARY ")]
    if summary:
        run.rows = json.loads(summary[-1][len("SUMMARY "):])
    return run


def main(argv: list[str]) -> int:
    smoke = "--smoke" in argv
    only = {a for a in argv if a != "--smoke"}
    rows: list[dict] = []
    failed: list[str] = []
    t0 = time.monotonic()
    for script in scripts():
        if only and script.stem.removeprefix("bench_") not in only:
            continue
        print(f"== {script.name}", flush=True)
        run = run_one(script, smoke)
        sys.stdout.write("\n".join(ln for ln in run.out.splitlines() if not ln.startswith("SUMMARY ")) + "\n")
        if run.failure:
            failed.append(run.failure)
            sys.stdout.write(run.err[-3000:])
            continue
        rows += run.rows
        print(f"   ({run.seconds:.0f}s)", flush=True)
    print("\n== summary" + (" (smoke mode: the figures mean nothing)" if smoke else ""))
    width = max([34] + [len(str(r["case"])) + 2 for r in rows])
    print(f"{'bench':<12}{'case':<{width}}{'metric':<16}{'value':>14} {'unit':<10}{'ratio':>8}")
    for r in rows:
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else ""
        print(f"{r['bench']:<12}{str(r['case']):<{width}}{r['metric']:<16}{r['value']:>14.4g} {r['unit']:<10}{ratio:>8}")
    print(f"\n({time.monotonic() - t0:.0f}s in all)")
    if failed:
        print("\nFAILED benches (their figures are left out above):")
        for f in failed:
            print(f"  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
