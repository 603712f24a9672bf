"""Gateway overhead: the same demo upstream through bare Envoy and through Modelyard, in one run.

Load comes from wrk (Debian's package) at 1 and 16 connections; each case runs `--rounds` times
and the median round is reported, with Modelyard's ratio to bare Envoy.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane.bootstrap import bootstrap_dict, build_bootstrap  # noqa: E402
from controlplane.environments import EnvironmentConfig  # noqa: E402
from devstack.launcher import Child, Stack, envoy_binary  # noqa: E402
from extproc.config import parse_config  # noqa: E402
from tests.stack_config import free_port  # noqa: E402

BODY = '{"model":"demo-gpt","messages":[{"role":"user","content":"hello from the benchmark"}]}'
LUA = """wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer sk-modelyard-demo"
""" % BODY


def _config() -> dict:
    up = free_port()
    return {
        "listener": {"address": "127.0.0.1", "port": free_port()},
        "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}"},
        "models": [{"name": "demo-gpt", "deployments": [
            {"cluster": "demo-openai", "protocol": "openai", "endpoints": [f"127.0.0.1:{up}"]}]}],
        "tenants": [{"name": "bench", "tier": "L1", "api_keys": [
            "sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"]}],
    }


def _bare_envoy(cfg_obj, env: EnvironmentConfig, port: int) -> dict:
    """Modelyard's own bootstrap minus ext_proc, routed straight to the demo cluster."""
    boot = bootstrap_dict(build_bootstrap(cfg_obj, env))
    listener = boot["static_resources"]["listeners"][0]
    listener["address"]["socket_address"]["port_value"] = port
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.ext_proc"]
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    route["match"] = {"prefix": "/"}
    route["route"].pop("cluster_header")
    route["route"]["cluster"] = "demo-openai"
    boot.pop("admin", None)
    return boot


def _ms(text: str) -> float:
    m = re.match(r"([\d.]+)(us|ms|s)", text)
    if not m:
        return float("nan")
    return float(m[1]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m[2]]


def peak_rss_mb(pid: int) -> float:
    """VmHWM: the process's peak resident set, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def wrk(url: str, conns: int, seconds: float, script: Path) -> dict:
    out = subprocess.run(["wrk", "-t1", f"-c{conns}", f"-d{max(1, round(seconds))}s", "--latency", "-s", str(script), url],
                         capture_output=True, text=True, timeout=seconds + 30).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M)[1])
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M)[1])
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"rps": rps, "p50_ms": p50, "p99_ms": p99, "errors": int(non2xx[1]) if non2xx else 0}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    if not shutil.which("wrk"):
        print("bench_gateway: wrk is not installed (apt-get install wrk); skipped")
        print("SUMMARY []")
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    data = _config()
    cfg_path = work / "modelyard.yaml"
    cfg_path.write_text(yaml.safe_dump(data))
    cfg = parse_config(data)
    env = EnvironmentConfig(name="bench", admin=None, concurrency=1)
    bare_port = free_port()
    (work / "bare.yaml").write_text(yaml.safe_dump(_bare_envoy(cfg, env, bare_port)))
    script = work / "post.lua"
    script.write_text(LUA)
    stack = Stack(cfg, env, config_path=cfg_path, workdir=work, quiet=True)
    stack.children.append(Child("bare-envoy", [envoy_binary(), "-c", str(work / "bare.yaml"), "--concurrency", "1",
                                               "--disable-hot-restart", "--log-level", "error"],
                                ("tcp", f"127.0.0.1:{bare_port}")))
    rows = []
    with stack:
        targets = {"bare-envoy": f"http://127.0.0.1:{bare_port}/v1/chat/completions",
                   "modelyard": f"{stack.url}/v1/chat/completions"}
        for url in targets.values():
            wrk(url, 4, 1.0, script)  # warm up connections and code paths
        results: dict[tuple[str, int], list[dict]] = {}
        for _ in range(a.rounds):
            for conns in (1, 16):
                for name, url in targets.items():
                    results.setdefault((name, conns), []).append(wrk(url, conns, a.seconds, script))
        memory = {name: peak_rss_mb(stack.child(child).proc.pid)
                  for name, child in (("extproc", "extproc"), ("modelyard envoy", "envoy"),
                                      ("bare envoy", "bare-envoy"))}
    print(f"{'case':<22}{'req/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'ratio':>8}")
    for conns in (1, 16):
        med = {}
        for name in targets:
            runs = results[(name, conns)]
            med[name] = {k: statistics.median(r[k] for r in runs) for k in ("rps", "p50_ms", "p99_ms")}
            med[name]["errors"] = sum(r["errors"] for r in runs)
        for name in targets:
            m = med[name]
            ratio = m["rps"] / med["bare-envoy"]["rps"]
            print(f"{name + f' c={conns}':<22}{m['rps']:>10.0f}{m['p50_ms']:>10.2f}{m['p99_ms']:>10.2f}{ratio:>8.2f}")
            for metric, unit in (("rps", "req/s"), ("p50_ms", "ms"), ("p99_ms", "ms")):
                row = {"bench": "gateway", "case": f"{name} c={conns}", "metric": metric, "value": round(m[metric], 3),
                       "unit": unit}
                if name == "modelyard":
                    row["baseline"] = round(med["bare-envoy"][metric], 3)
                    row["ratio"] = round(m[metric] / med["bare-envoy"][metric], 3)
                rows.append(row)
            if m["errors"]:
                print(f"  warning: {m['errors']} non-2xx responses for {name} c={conns}")
    print("\npeak RSS after the load (MB): " + ", ".join(f"{k} {v:.0f}" for k, v in memory.items()))
    for name, mb in memory.items():
        row = {"bench": "gateway", "case": name, "metric": "peak_rss", "value": round(mb, 1), "unit": "MB"}
        if name == "modelyard envoy":
            row.update(baseline=round(memory["bare envoy"], 1), ratio=round(mb / memory["bare envoy"], 3))
        rows.append(row)
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
