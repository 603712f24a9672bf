"""Scale from zero: how long a caller held for a deployment with no replica waits beyond the replica's
own start-up.

One stack through Envoy with several `scale_from_zero` models (one per round, each cold once), each
asking its own stand-in Kubernetes API (devstack.demo.scaler) that starts the demo server
`START_DELAY_S` after the scale request. Per round: the time from the first held call to its answer;
minus the stand-in's start delay (what the gateway added: the scale request, readiness probes every
`probe_s`, the warm-up, the queue's resume); and from the replica listening to the first answer. The
baseline in the same run: a call to the same model once warm. Medians over rounds; the box is shared.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import scratch  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from devstack.demo.scaler import Scaler  # noqa: E402
from tests.stack_config import free_port, small_config, start_stack  # noqa: E402
from tests.threaded_app import ThreadedApp  # noqa: E402

KEY = "sk-modelyard-demo"
START_DELAY_S = scaled(1.0, 0.3)
ROUNDS = scaled(5, 1)
PROBE_S = 0.25  # the shipped default


def _model(i: int, upstream: int, api: int, token: str) -> dict:
    return {"name": f"cold-{i}", "task_types": ["chat"], "capabilities": {"context_window": 8192},
            "deployments": [{
                "cluster": f"cold-{i}", "protocol": "openai", "endpoints": [f"127.0.0.1:{upstream}"],
                "health_check": {"http_path": "/health", "interval_s": 2}, "warmup": {"prompt": "ping"},
                "max_inflight": 4, "queue": {"bound": 16, "max_wait_s": 30},
                "scale_from_zero": {"probe_s": PROBE_S, "kubernetes": {
                    "namespace": "bench", "deployment": f"cold-{i}", "api_url": f"http://127.0.0.1:{api}",
                    "token_file": token, "ca_file": None}}}]}


def _ask(client: httpx.Client, url: str, model: str) -> float:
    t0 = time.monotonic()
    r = client.post(url, json={"model": model, "messages": [{"role": "user", "content": "hello"}]})
    if r.status_code != 200:
        print(f"FAILED: {model}: {r.status_code} {r.text[:200]}", flush=True)
        raise SystemExit(1)
    return time.monotonic() - t0


def main() -> int:
    work = scratch.folder("bench-coldstart-")
    token = work / "token"
    token.write_text("bench-token")
    scalers = [Scaler(free_port(), name=f"cold-{i}", start_delay_s=START_DELAY_S) for i in range(ROUNDS)]
    apis = [ThreadedApp(s.app()) for s in scalers]
    for a in apis:
        a.__enter__()
    try:
        data = small_config()
        data["models"] += [_model(i, s.upstream[1], a.port, str(token)) for i, (s, a) in enumerate(zip(scalers, apis))]
        data["tenants"] = [{**t, "allowed_models": ["*"]} for t in data["tenants"]]
        with start_stack(work, data) as stack, httpx.Client(timeout=90, headers={"authorization": f"Bearer {KEY}"}) as c:
            url = f"{stack.url}/v1/chat/completions"
            cold, added, after_up, warm = [], [], [], []
            for i, s in enumerate(scalers):
                t0 = time.monotonic()
                cold.append(_ask(c, url, f"cold-{i}"))
                assert s.started_at is not None and s.calls, "the stand-in was never asked"
                added.append(cold[-1] - START_DELAY_S)
                after_up.append(t0 + cold[-1] - s.started_at)
                warm.append(statistics.median(_ask(c, url, f"cold-{i}") for _ in range(scaled(5, 2))))
    finally:
        for a in apis:
            a.__exit__(None, None, None)
    rows = [
        {"bench": "coldstart", "case": "first held call -> answer", "metric": "median", "value":
         round(statistics.median(cold), 3), "unit": "s"},
        {"bench": "coldstart", "case": f"minus the stand-in's {START_DELAY_S:g} s start", "metric": "median",
         "value": round(statistics.median(added), 3), "unit": "s"},
        {"bench": "coldstart", "case": "replica listening -> first answer", "metric": "median",
         "value": round(statistics.median(after_up), 3), "unit": "s"},
        {"bench": "coldstart", "case": "same model, warm (baseline)", "metric": "median",
         "value": round(statistics.median(warm), 4), "unit": "s"},
    ]
    for r in rows:
        print(f"{r['case']:45s} {r['value']:>8} {r['unit']}  ({ROUNDS} rounds, probe_s {PROBE_S})")
    print("SUMMARY " + json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(scratch.run(main))
