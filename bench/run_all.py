"""`make bench`: run every bench/bench_*.py and print one summary table from their SUMMARY lines."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


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
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
        summary = [ln for ln in proc.stdout.splitlines() if ln.startswith("SUMMARY ")]
        sys.stdout.write("\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("SUMMARY ")) + "\n")
        if proc.returncode != 0 or not summary:
            failed.append(script.name)
            sys.stdout.write(proc.stderr[-3000:])
            continue
        rows += json.loads(summary[-1][len("SUMMARY "):])
        print(f"   ({time.monotonic() - t:.0f}s)", flush=True)
    print("\n== summary")
    print(f"{'bench':<12}{'case':<34}{'metric':<16}{'value':>14} {'unit':<10}{'ratio':>8}")
    for r in rows:
        ratio = f"{r['ratio']:.3g}" if r.get("ratio") is not None else ""
        print(f"{r['bench']:<12}{str(r['case']):<34}{r['metric']:<16}{r['value']:>14.4g} {r['unit']:<10}{ratio:>8}")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
