"""The whole demand through a real stack: every decision lands in the metering store, the
tuner's what-if of the config in use reproduces what the live limiter did, and with
`extproc.workers: 2` a limit holds for the host, not per worker."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import DEMO_KEY
from tests.stack_config import free_ports_run, small_config, start_stack

pytestmark = pytest.mark.e2e
KEYS = {"demo": DEMO_KEY, "demo-l2": "sk-modelyard-demo-l2", "demo-l3": "sk-modelyard-demo-l3",
        "demo-limited": "sk-modelyard-demo-limited"}
SHIPPED = yaml.safe_load((Path(__file__).resolve().parents[2] / "modelyard.yaml").read_text())["ratelimit"]


def _chat(client: httpx.Client, url: str, key: str) -> int:
    r = client.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                    json={"model": "demo-gpt", "messages": [{"role": "user", "content": "count me"}]}, timeout=10)
    assert r.status_code in (200, 429), r.text
    return r.status_code


def _tune(argv: list[str], capsys) -> dict:
    from ratelimit.tuning.cli import main

    capsys.readouterr()
    assert main([*argv, "--json", "--quiet-curves"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("workers", [1, 2])
def test_whatif_reproduces_live_decisions_on_a_bursty_multi_tenant_run(tmp_path: Path, capsys, monkeypatch,
                                                                        workers: int) -> None:
    limits = [*SHIPPED["limits"],
              {"scope": "tenant", "match": "demo", "unit": "requests", "rate": 4, "burst": 4},
              {"scope": "tier", "match": "L2", "unit": "requests", "rate": 2, "burst": 3}]
    data = small_config(ratelimit={"backend": "memory", "limits": limits})
    data["extproc"].update(metering_db="metering.sqlite")
    if workers > 1:  # the host's buckets, two writers of one store: the same agreement
        grpc_port, metrics_port = free_ports_run(workers), free_ports_run(workers)
        data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                               workers=workers)
    seen: dict[str, list[int]] = {k: [] for k in KEYS}
    with start_stack(tmp_path, data) as stack, httpx.Client() as client:
        # The scenario: 20 quick requests on the shipped 1/s burst-3 limit.
        seen["demo-limited"] = [_chat(client, stack.url, KEYS["demo-limited"]) for _ in range(20)]

        def bursts(tenant: str, size: int, pause: float) -> None:
            with httpx.Client() as own:
                for _ in range(4):
                    seen[tenant] += [_chat(own, stack.url, KEYS[tenant]) for _ in range(size)]
                    time.sleep(pause)

        callers = [threading.Thread(target=bursts, args=a) for a in
                   (("demo", 7, 0.4), ("demo-l2", 5, 0.7), ("demo-l3", 6, 0.2))]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        config_path = stack.config_path
    # the stack stopped: the metering store wrote every accepted row on the way out
    assert seen["demo-limited"].count(200) == 3 and seen["demo-limited"].count(429) == 17
    assert seen["demo"].count(429) > 0 and seen["demo-l2"].count(429) > 0

    # --config and --metering-db default to the config in use and the store it names
    monkeypatch.setenv("MODELYARD_CONFIG", str(config_path))
    out = _tune(["--key", "tenant", "--unit", "requests"], capsys)
    by_key = {k["key"]: k for k in out["keys"]}
    assert set(by_key) == set(KEYS)
    for tenant, statuses in seen.items():
        k = by_key[tenant]
        assert k["requests"] == len(statuses)  # refusals are part of the demand now
        assert k["live_rejected"] == statuses.count(429)
        assert abs(k["current_rejected"] - k["live_rejected"]) <= 1, (tenant, k)
        assert k["rate"] is not None and k["burst"] is not None and k["rejected"] is not None
    assert out["config"] == str(config_path)
    assert abs(out["total"]["current_rejected"] - out["total"]["live_rejected"]) <= 2
    limited = by_key["demo-limited"]
    assert limited["current_bound_by"] == {"tenant:demo-limited:requests": limited["current_rejected"]}


def test_two_workers_hold_one_limit_for_the_host(tmp_path: Path) -> None:
    rate, burst = 5.0, 5
    data = small_config(ratelimit={"limits": [
        {"scope": "tenant", "match": "demo", "unit": "requests", "rate": rate, "burst": burst}]})
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, audit_db=None, tasks=None, batches=None)
    statuses: list[int] = []
    lock = threading.Lock()
    with start_stack(tmp_path, data) as stack:
        start = time.monotonic()

        def caller() -> None:
            with httpx.Client() as client:
                while time.monotonic() - start < 3.0:
                    s = _chat(client, stack.url, DEMO_KEY)
                    with lock:
                        statuses.append(s)

        callers = [threading.Thread(target=caller) for _ in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        elapsed = time.monotonic() - start
        decided = [_decisions(f"127.0.0.1:{metrics_port + i}") for i in range(2)]
    assert all(n > 0 for n in decided), decided  # both workers decided requests
    admitted = statuses.count(200)
    assert statuses.count(429) > 0
    assert burst <= admitted <= math.floor(burst + rate * elapsed) + 1, (admitted, elapsed, len(statuses))


def _decisions(metrics_address: str) -> float:
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines()
               if ln.startswith("modelyard_ratelimit_decisions_total{"))


def test_envoy_filter_decisions_are_recorded_too(tmp_path: Path) -> None:
    from controlplane.environments import EnvironmentConfig

    data = small_config(ratelimit={"enforce": "envoy", "limits": [
        {"scope": "tenant", "match": "demo", "unit": "requests", "rate": 0.01, "burst": 2}]})
    data["extproc"].update(metering_db="metering.sqlite")
    env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                            rate_limit_service={"domain": "modelyard", "timeout_s": 1.0})
    with start_stack(tmp_path, data, env) as stack, httpx.Client() as client:
        statuses = [_chat(client, stack.url, DEMO_KEY) for _ in range(4)]
    assert statuses == [200, 200, 429, 429]
    import sqlite3

    with sqlite3.connect(tmp_path / "metering.sqlite") as db:
        rows = db.execute("SELECT tenant, allowed, requests, rule FROM decisions WHERE tenant = 'demo' "
                          "ORDER BY ts").fetchall()
    assert rows == [("demo", 1, 1, ""), ("demo", 1, 1, ""), ("demo", 0, 1, "tenant:demo:requests"),
                    ("demo", 0, 1, "tenant:demo:requests")]


def _counted(metrics_address: str, *names: str) -> float:
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if any(ln.startswith(n + "{") for n in names))


def test_two_workers_hold_one_max_inflight_for_the_host(tmp_path: Path) -> None:
    """max_inflight 2, no queue, six callers at once each holding the upstream 4 s: two answered,
    whichever worker their streams reached (per worker it would have been two each)."""
    data = small_config()
    data["models"][0]["deployments"][0].update(max_inflight=2, queue={"bound": 0})
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, audit_db=None, tasks=None, batches=None)
    statuses: list[int] = []
    with start_stack(tmp_path, data) as stack:
        def call(i: int) -> None:
            r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                           json={"model": "demo-gpt", "messages": [{"role": "user", "content": f"demo-hold-4000 {i}"}]},
                           timeout=30)
            statuses.append(r.status_code)

        callers = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in callers:
            t.start()
        for t in callers:
            t.join()
        seen = [_counted(f"127.0.0.1:{metrics_port + i}", "modelyard_requests_total", "modelyard_queue_refused_total")
                for i in range(2)]
    assert all(n > 0 for n in seen), seen  # both workers decided some of them
    assert sorted(statuses) == [200, 200, 503, 503, 503, 503], statuses
