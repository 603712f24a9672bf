"""`make bench`: run every bench/bench_*.py and print one summary table from their SUMMARY lines.

A bench fails when it exits non-zero (the ones that send requests do so on any unexpected status
or transport error, printing `FAILED:` lines), prints no SUMMARY line, or runs past its timeout.
Every bench still runs; the exit status is 1 if any failed, and the failures are listed by name.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 900


def _run(script: Path) -> tuple[int | str, str, str]:
    """(exit status or "timed out", stdout, stderr) of one bench."""
    try:
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        def text(b: bytes | str | None) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")
        return f"timed out after {TIMEOUT_S}s", text(e.stdout), text(e.stderr)
    return proc.returncode, proc.stdout, proc.stderr


def main(argv: list[str]) -> int:
    only = set(argv)
    rows: list[dict] = []
    failed: list[str] = []
    # The gateway overhead first: it is the figure every other one sits on.
    for script in sorted(HERE.glob("bench_*.py"), key=lambda p: (p.stem != "bench_gateway", p.stem)):
        if only and script.stem.removeprefix("bench_") not in only:
            continue
        print(f"== {script.name}", flush=True)
        t = time.monotonic()
        status, out, err = _run(script)
        lines = out.splitlines()
        summary = [ln for ln in lines if ln.startswith("SUMMARY ")]
        sys.stdout.write("\n".join(ln for ln in lines if not ln.startswith("SUMMARY ")) + "\n")
        if status != 0 or not summary:
            why = "no SUMMARY line" if status == 0 else f"exit {status}" if isinstance(status, int) else status
            reasons = [ln for ln in lines if ln.startswith("FAILED: ")]
            failed.append(f"{script.name} ({why})" + "".join(f"\n    {r}" for r in reasons))
            sys.stdout.write(err[-3000:])
            continue
        rows += json.loads(summary[-1][len("SUMMARY "):])
        print(f"   ({time.monotonic() - t:.0f}s)", flush=True)
    print("\n== summary")
    print(f"{'bench':<12}{'case':<34}{'metric':<16}{'value':>14} {'unit':<10}{'ratio':>8}")
    for r in rows:
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else ""
        print(f"{r['bench']:<12}{str(r['case']):<34}{r['metric']:<16}{r['value']:>14.4g} {r['unit']:<10}{ratio:>8}")
    if failed:
        print("\nFAILED benches (their figures are left out above):")
        for f in failed:
            print(f"  {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
