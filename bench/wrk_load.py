"""wrk runs whose every response is accounted for: a Lua script counts statuses per thread and
prints them, with wrk's socket errors and the run's duration, in machine-readable lines.

wrk's own summary only says "Non-2xx or 3xx responses: N" and counts those in Requests/sec;
here the figures come from the expected responses only (see bench.outcomes).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from bench.outcomes import Tally

# done() runs in wrk's main Lua state; each thread's `statuses` table is copied out with t:get.
_COUNTING = """
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) statuses = {} end
function response(status, headers, body) statuses[status] = (statuses[status] or 0) + 1 end
function done(summary, latency, requests)
  local total = {}
  for _, t in ipairs(threads) do
    for s, n in pairs(t:get("statuses")) do total[s] = (total[s] or 0) + n end
  end
  io.write("MODELYARD-WRK-STATUSES")
  for s, n in pairs(total) do io.write(string.format(" %d=%d", s, n)) end
  local e = summary.errors
  io.write(string.format("\\nMODELYARD-WRK-ERRORS connect=%d read=%d write=%d timeout=%d status=%d\\n",
                         e.connect, e.read, e.write, e.timeout, e.status))
  io.write(string.format("MODELYARD-WRK-RUN duration_us=%d requests=%d\\n", summary.duration, summary.requests))
end
"""

# wrk's names for its socket error kinds, as they appear in our outcome counts.
SOCKET_ERRORS = ("connect", "read", "write", "timeout")


def lua_string(text: str) -> str:
    """A Lua 5.1 string literal: printable ASCII as is, every other byte as a 3-digit escape."""
    # Lua 5.1 (wrk's LuaJIT) has no \u escapes, so JSON's quoting would not do.
    return '"' + "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:03d}"
                         for b in text.encode()) + '"'


def post_script(body: str, headers: dict[str, str]) -> str:
    """A wrk script that POSTs `body` with `headers` and counts every response's status."""
    lines = ['wrk.method = "POST"', f"wrk.body = {lua_string(body)}"]
    lines += [f"wrk.headers[{lua_string(k)}] = {lua_string(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n" + _COUNTING


@dataclass
class WrkResult:
    """One wrk run: what came back, for how long, and the latency wrk measured."""

    tally: Tally
    duration_s: float
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    raw: str = field(default="", repr=False)

    @property
    def ok_rps(self) -> float:
        """Requests per second counting only expected responses."""
        return self.tally.ok / self.duration_s if self.duration_s > 0 else 0.0


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)$", text)
    if not m:
        return float("nan")
    return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]


def parse_wrk(out: str, tally: Tally) -> WrkResult:
    """Fill `tally` from the output of a wrk run with a `post_script` script.

    Every socket error counts against the case: wrk 4.1 (Debian's) abandons the requests still in
    flight when the duration ends without counting them, so an error here is a real one. Output
    without our lines (a script that failed to load, wrk that crashed) is a failure too.
    """
    statuses = re.search(r"^MODELYARD-WRK-STATUSES(.*)$", out, re.M)
    errors = re.search(r"^MODELYARD-WRK-ERRORS (.*)$", out, re.M)
    run = re.search(r"^MODELYARD-WRK-RUN duration_us=(\d+) requests=(\d+)$", out, re.M)
    if not (statuses and errors and run):
        tally.add("no wrk report")
        return WrkResult(tally, 0.0, raw=out)
    for pair in statuses[1].split():
        status, n = pair.split("=")
        tally.add(int(status), int(n))
    errs = dict(pair.split("=") for pair in errors[1].split())
    for kind in SOCKET_ERRORS:
        tally.add(f"{kind} error", int(errs[kind]))
    # A response the Lua hook missed would be unaccounted for: wrk's own count must match ours.
    missing = int(run[2]) - sum(n for o, n in tally.counts.items() if isinstance(o, int))
    if missing > 0:
        tally.add("uncounted response", missing)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    return WrkResult(tally, int(run[1]) / 1e6, _ms(p50[1]) if p50 else float("nan"),
                     _ms(p99[1]) if p99 else float("nan"), out)


def run_wrk(url: str, conns: int, seconds: float, script: Path, tally: Tally) -> WrkResult:
    """One wrk run (one thread, `conns` connections, whole seconds) into `tally`."""
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        tally.add("wrk timed out")
        return WrkResult(tally, 0.0)
    if proc.returncode != 0:
        tally.add(f"wrk exit {proc.returncode}")
    return parse_wrk(proc.stdout + proc.stderr, tally)
