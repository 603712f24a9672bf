"""Peers side by side: LiteLLM's proxy (one worker, its own venv) and Modelyard (the shipped demo
config on free ports) in front of the same demo OpenAI upstreams, with the same wrk settings, in
one run: interleaved rounds at 1 and 16 connections, medians, Modelyard's ratio to LiteLLM.

    make bench-peers      # installs `litellm[proxy]` into .venv-peers, then runs this

Without .venv-peers/bin/litellm it prints why and an empty summary (so `make bench` passes by).
Every response's status is counted (bench.wrk_load); any non-200 fails the bench.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.outcomes import Tally, report  # noqa: E402
from bench.wrk_load import WrkResult, post_script, run_wrk  # noqa: E402
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS  # noqa: E402
from tests.stack_config import demo_config_free_ports, free_port, start_stack  # noqa: E402

LITELLM = ROOT / ".venv-peers" / "bin" / "litellm"
BODY = '{"model":"demo-gpt","messages":[{"role":"user","content":"hello from the benchmark"}]}'
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {DEMO_KEY}"}


def litellm_config(data: dict) -> dict:
    """demo-gpt's deployments (the same upstreams Modelyard's demo config routes to), one model name."""
    model = next(m for m in data["models"] if m["name"] == "demo-gpt")
    entries = []
    for dep in model["deployments"]:
        params = {"model": "openai/demo-gpt", "api_base": f"http://{dep['endpoints'][0]}/v1",
                  "api_key": os.environ.get(dep.get("api_key_env") or "", "unused")}
        entries.append({"model_name": "demo-gpt", "litellm_params": params})
    return {"model_list": entries, "general_settings": {"master_key": DEMO_KEY},
            "litellm_settings": {"set_verbose": False}}


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"litellm not ready after {timeout_s:.0f}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    if not shutil.which("wrk") or not LITELLM.exists():
        print("bench_peers: needs wrk and .venv-peers (make bench-peers installs LiteLLM there); skipped")
        print("SUMMARY []")
        return 0
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    work = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    data, _ = demo_config_free_ports()
    (work / "modelyard").mkdir()
    stack = start_stack(work / "modelyard", data)
    script = work / "post.lua"
    script.write_text(post_script(BODY, HEADERS))
    (work / "litellm.yaml").write_text(yaml.safe_dump(litellm_config(data)))
    port = free_port()
    tallies: list[Tally] = []
    results: dict[tuple[str, int], list[WrkResult]] = {}
    with stack, open(work / "litellm.log", "wb") as log:
        proc = subprocess.Popen([str(LITELLM), "--config", str(work / "litellm.yaml"), "--host", "127.0.0.1",
                                 "--port", str(port), "--num_workers", "1"], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_http(f"http://127.0.0.1:{port}/health/liveliness", proc)
            targets = {"litellm": f"http://127.0.0.1:{port}/v1/chat/completions",
                       "modelyard": f"{stack.url}/v1/chat/completions"}
            for name, url in targets.items():
                tallies.append(Tally("peers", f"{name} warm-up"))
                run_wrk(url, 4, 2.0, script, tallies[-1])
            for i in range(a.rounds):
                for conns in (1, 16):
                    for name, url in targets.items():
                        tallies.append(Tally("peers", f"{name} c={conns} round {i + 1}"))
                        results.setdefault((name, conns), []).append(
                            run_wrk(url, conns, a.seconds, script, tallies[-1]))
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    rows = []
    print(f"{'case':<22}{'ok req/s':>10}{'p50 ms':>10}{'ratio':>8}")
    for conns in (1, 16):
        rps = {n: statistics.median(r.ok_rps for r in results[(n, conns)]) for n in ("litellm", "modelyard")}
        p50 = {n: statistics.median(r.p50_ms for r in results[(n, conns)]) for n in ("litellm", "modelyard")}
        ratio = rps["modelyard"] / rps["litellm"] if rps["litellm"] else float("nan")
        for n in ("litellm", "modelyard"):
            print(f"{n + f' c={conns}':<22}{rps[n]:>10.0f}{p50[n]:>10.2f}{(ratio if n == 'modelyard' else 1):>8.2f}")
        rows.append({"bench": "peers", "case": f"demo c={conns}", "metric": "rps", "value": round(rps["modelyard"], 1),
                     "unit": "req/s", "baseline": round(rps["litellm"], 1), "ratio": round(ratio, 2)})
    print("SUMMARY " + json.dumps(rows))
    return report(tallies)


if __name__ == "__main__":
    raise SystemExit(main())
