"""What the audit log costs the extproc: CPU time per request with it off, on, and on with body
capture, on one stack each (Envoy, extproc, the demo upstream), under wrk at 16 connections.

CPU per request is the extproc process's user+system time delta over the 200s wrk counted: it is
steadier than req/s on a shared machine. Each case also checks its audit table holds one row per
request answered (the writer kept up, nothing lost). Non-200s fail the case.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.outcomes import Tally, report  # noqa: E402
from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import SMOKE, scaled  # noqa: E402
from bench.wrk_load import post_script, run_wrk  # noqa: E402
from tests.stack_config import small_config, start_stack  # noqa: E402

BODY = '{"model":"demo-gpt","messages":[{"role":"user","content":"hello from the audit benchmark, ACCT-123456"}]}'
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-modelyard-demo"}


class AuditCase(TypedDict, total=False):
    audit_db: str  # the audit log's file, in the run's directory; none: the log is off
    capture: bool  # the tenant's bodies are captured (redacted, capped)


CASES: dict[str, AuditCase] = {
    "off": {},
    "on": {"audit_db": "audit.sqlite"},
    "on+bodies": {"audit_db": "audit.sqlite", "capture": True},
}




def run_case(name: str, seconds: float, rounds: int, tallies: list[Tally]) -> tuple[float, int, int | None]:
    opts = CASES[name]
    data = small_config()
    data["extproc"].pop("metering_db", None)  # measure the audit log alone
    data["extproc"].pop("audit_db", None)  # the demo config turns it on
    if opts.get("audit_db"):
        data["extproc"]["audit_db"] = opts["audit_db"]
    if opts.get("capture"):
        data["tenants"][0]["audit"] = {"capture_bodies": True, "max_body_bytes": 4096, "redact": [r"ACCT-\d{6}"]}
    work = scratch.folder(f"bench-audit-{name}-")
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    per_req: list[float] = []
    answered = 0  # 200s, warm-up included: each must have its audit row
    with start_stack(work, data) as stack:
        pid = stack.child("extproc").proc.pid
        url = f"{stack.url}/v1/chat/completions"
        if not SMOKE:  # a smoke run's one round runs the same path
            warm = Tally("audit", f"{name} warm-up")
            tallies.append(warm)
            run_wrk(url, 16, 2, script, warm)
            answered += warm.counts[200]
        for i in range(rounds):
            tally = Tally("audit", f"{name} round {i + 1}")
            tallies.append(tally)
            before = cpu_seconds(pid)
            run_wrk(url, 16, seconds, script, tally)
            time.sleep(0.5)  # let the stream closes (and their rows) finish before reading CPU
            cpu = cpu_seconds(pid) - before
            per_req.append(cpu / max(1, tally.counts[200]) * 1e6)
            answered += tally.counts[200]
        db = stack.cfg.extproc.audit_db
    rows = None
    if db:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT COUNT(*) FROM audit WHERE event = 'call' AND status = 200").fetchone()[0]
    return statistics.median(per_req), answered, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seconds", type=float, default=scaled(5, 1))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    p.add_argument("--cases", default=",".join(CASES))
    a = p.parse_args()
    tallies: list[Tally] = []
    summary: list[dict] = []
    lost = False
    for name in a.cases.split(","):
        us, answered, rows = run_case(name, a.seconds, a.rounds, tallies)
        extra = "" if rows is None else f"; audit rows for them: {rows}"
        print(f"audit {name:10s} extproc CPU/request {us:7.0f} us (median of {a.rounds}); {answered} 200s{extra}")
        row = {"bench": "audit", "case": name, "metric": "extproc_cpu", "value": round(us, 1), "unit": "us/req"}
        if name != "off" and summary and summary[0]["case"] == "off":
            row.update(baseline=summary[0]["value"], ratio=round(us / summary[0]["value"], 3))
        summary.append(row)
        # wrk drops the requests in flight when a run ends uncounted; the gateway still answered them.
        if rows is not None and rows < answered:
            print(f"FAILED: {name}: {answered} requests answered, only {rows} audit rows")
            lost = True
    print("SUMMARY " + json.dumps(summary))
    return max(report(tallies), int(lost))


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
