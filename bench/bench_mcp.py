"""/mcp: what the gateway adds to a tool call, against calling the MCP server directly, same run.

- a tools/call (the HTTP demo's `echo`), sequential, median latency: direct to the FastMCP server,
  then through Envoy + extproc (key, session map, allow-list, buckets, audit row, metrics), taken
  as SSE (the spec's clients: carried by the extproc's stream relay, event ids in the event log)
  and as JSON only (answered by the extproc itself);
- gateway CPU per call (Envoy + extproc CPU-time deltas over the calls) beside the server's own;
- tools/list through the gateway (a fan-out to both demo servers, merged) against one server's.

Any unexpected status fails the bench with a `FAILED:` line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proc_cpu import cpu_seconds  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from tests.stack_config import _remap, small_config, start_stack  # noqa: E402

KEY = "sk-modelyard-demo"
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}


def _open(c: httpx.Client, url: str, headers: dict[str, str], failures: list[str]) -> dict[str, str]:
    r = c.post(url, json=INIT, headers=headers)
    if r.status_code != 200:
        failures.append(f"initialize {url}: {r.status_code} {r.text[:200]}")
        return headers
    h = {**headers, "mcp-session-id": r.headers["mcp-session-id"], "mcp-protocol-version": "2025-06-18"}
    c.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
    return h


def _timed(c: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any], n: int, what: str,
           failures: list[str], pids: list[int]) -> tuple[list[float], list[float]]:
    lat: list[float] = []
    cpu0 = [cpu_seconds(p) for p in pids]
    for i in range(n):
        t = time.perf_counter()
        r = c.post(url, json={**body, "id": i + 1}, headers=headers)
        lat.append(time.perf_counter() - t)
        if r.status_code != 200 or b'"result"' not in r.content:
            failures.append(f"{what}: {r.status_code} {r.text[:200]}")
            break
    return lat, [(cpu_seconds(p) - c0) / n for p, c0 in zip(pids, cpu0, strict=True)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=scaled(300, 5))
    p.add_argument("--rounds", type=int, default=scaled(3, 1))
    a = p.parse_args(argv)
    failures: list[str] = []
    params = {"name": "echo", "arguments": {"text": "bench"}}
    call = {"jsonrpc": "2.0", "method": "tools/call", "params": params}
    gw_call = {**call, "params": {**params, "name": "demo-http__echo"}}
    listing = {"jsonrpc": "2.0", "method": "tools/list", "params": {}}
    with tempfile.TemporaryDirectory(prefix="bench-mcp-") as tmp:
        data = small_config()
        shipped = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
        data.update(_remap({k: shipped[k] for k in ("mcp_servers", "mcp")}, {}))
        data["mcp"]["limits"] = []
        data["devstack"] = {"demo_mcp_servers": ["demo-http"]}
        with start_stack(Path(tmp), data) as stack, httpx.Client(timeout=60) as c:
            server_url = next(s["url"] for s in data["mcp_servers"] if s["name"] == "demo-http")
            gw_url = f"{stack.url}/mcp"
            direct_h = _open(c, server_url, HEADERS, failures)
            gw_h = _open(c, gw_url, {**HEADERS, "authorization": f"Bearer {KEY}"}, failures)
            pids = [stack.child(n).proc.pid for n in ("envoy", "extproc", "mcp-demo-http")]
            for url, h, body in ((server_url, direct_h, call), (gw_url, gw_h, gw_call)):  # warm-up
                _timed(c, url, h, body, scaled(20, 2), "warm-up", failures, pids)
            med: dict[str, list[float]] = {k: [] for k in ("direct", "gateway", "envoy", "extproc", "server",
                                                           "list1", "list2", "json", "json_cpu")}
            json_h = {**gw_h, "accept": "application/json"}  # a JSON-only client: the extproc answers itself
            for _ in range(a.rounds):
                lat, _cpu = _timed(c, server_url, direct_h, call, a.n, "direct call", failures, pids)
                med["direct"].append(statistics.median(lat))
                lat, cpu = _timed(c, gw_url, gw_h, gw_call, a.n, "gateway call", failures, pids)
                med["gateway"].append(statistics.median(lat))
                med["envoy"].append(cpu[0])
                med["extproc"].append(cpu[1])
                med["server"].append(cpu[2])
                lat, cpu = _timed(c, gw_url, json_h, gw_call, a.n, "gateway call (JSON)", failures, pids)
                med["json"].append(statistics.median(lat))
                med["json_cpu"].append(cpu[0] + cpu[1])
                lat, _cpu = _timed(c, server_url, direct_h, listing, max(1, a.n // 5), "direct list", failures, pids)
                med["list1"].append(statistics.median(lat))
                lat, _cpu = _timed(c, gw_url, gw_h, listing, max(1, a.n // 5), "gateway list", failures, pids)
                med["list2"].append(statistics.median(lat))
    if failures:
        for f in failures[:20]:
            print(f"FAILED: {f}")
        return 1
    m = {k: statistics.median(v) for k, v in med.items()}
    rows = [
        {"case": "tools/call direct (baseline)", "metric": "p50_latency", "value": round(m["direct"] * 1e3, 3),
         "unit": "ms", "ratio": 1.0},
        {"case": "tools/call through the gateway", "metric": "p50_latency", "value": round(m["gateway"] * 1e3, 3),
         "unit": "ms", "ratio": round(m["gateway"] / m["direct"], 3)},
        {"case": "tools/call through the gateway, JSON only (no relay)", "metric": "p50_latency",
         "value": round(m["json"] * 1e3, 3), "unit": "ms", "ratio": round(m["json"] / m["direct"], 3)},
        {"case": "tools/call added by the gateway", "metric": "p50_latency",
         "value": round((m["gateway"] - m["direct"]) * 1e3, 3), "unit": "ms"},
        {"case": "tools/call: the server's own CPU (baseline)", "metric": "cpu_per_call",
         "value": round(m["server"] * 1e6, 1), "unit": "us", "ratio": 1.0},
        {"case": "tools/call: gateway CPU (Envoy + extproc)", "metric": "cpu_per_call",
         "value": round((m["envoy"] + m["extproc"]) * 1e6, 1), "unit": "us",
         "ratio": round((m["envoy"] + m["extproc"]) / m["server"], 3)},
        {"case": "tools/call JSON only: gateway CPU (Envoy + extproc)", "metric": "cpu_per_call",
         "value": round(m["json_cpu"] * 1e6, 1), "unit": "us", "ratio": round(m["json_cpu"] / m["server"], 3)},
        {"case": "tools/call: extproc CPU", "metric": "cpu_per_call", "value": round(m["extproc"] * 1e6, 1),
         "unit": "us"},
        {"case": "tools/list one server direct (baseline)", "metric": "p50_latency",
         "value": round(m["list1"] * 1e3, 3), "unit": "ms", "ratio": 1.0},
        {"case": "tools/list through the gateway (2 servers, fan-out)", "metric": "p50_latency",
         "value": round(m["list2"] * 1e3, 3), "unit": "ms", "ratio": round(m["list2"] / m["list1"], 3)},
    ]
    for r in rows:
        r["bench"] = "mcp"
    print(f"{a.n} sequential calls x {a.rounds} rounds (medians of rounds); ratios against the baseline row")
    for r in rows:
        print(f"{r['case']:<55} {r['value']:>10} {r['unit']:<3} {r.get('ratio', '')}")
    print("SUMMARY " + orjson.dumps(rows).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
