"""Live reload of the extproc through a real Envoy under load (extproc/live/reload.py): SIGHUP with a changed
file, while 4 clients call demo-gpt without pause. A new tenant's key and a new model on a cluster Envoy
already routes answer within 3 s, a changed rate limit and `max_inflight` take effect, a broken file is
refused while traffic continues, and a removal takes effect; the load sees no non-2xx, and neither Envoy
nor any extproc worker is replaced. Two workers: SIGHUP to `serve` reaches both, each shows the version.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from contracts.config import hash_api_key
from contracts.live_config import config_version
from tests.conftest import DEMO_KEY
from tests.live_control_plane import ControlPlane
from tests.stack_config import free_port, free_ports_run, small_config, start_stack

pytestmark = pytest.mark.e2e
CLUSTER = "demo-openai"
NEW_KEY = "sk-live-reload-newcomer"
LIMITED = "sk-modelyard-demo-limited"
WITHIN_S = 3.0
CLIENTS = 4
LOAD_LIMIT_S = 120.0  # the load stops by itself past this, whatever happens to the test


class Load:
    """CLIENTS threads calling demo-gpt back to back until stopped; every status counted."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: Counter[int | str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        deadline = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    status: int | str = client.post(f"{self.url}/v1/chat/completions", headers={
                        "authorization": f"Bearer {DEMO_KEY}"}, json={
                        "model": "demo-gpt", "messages": [{"role": "user", "content": "steady"}]}).status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                with self._lock:
                    self.statuses[status] += 1

    def seen(self) -> Counter[int | str]:
        with self._lock:
            return Counter(self.statuses)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=35)


def _base() -> dict[str, Any]:
    data = small_config(ratelimit={"limits": [
        {"scope": "tenant", "match": "demo-limited", "unit": "requests", "rate": 0.001, "burst": 1}]})
    data["models"][0]["deployments"][0].update(max_inflight=1, queue={"max_wait_s": 30, "bound": 64})
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, metering_db=None, audit_db=None, tasks=None, batches=None)
    return data


def _changed(base: dict[str, Any]) -> dict[str, Any]:
    """A new tenant with a new key, a new model on the cluster Envoy already has, a faster limit, more slots."""
    data = copy.deepcopy(base)
    data["tenants"].append({"name": "newcomer", "tier": "L2", "api_keys": [hash_api_key(NEW_KEY)],
                            "allowed_models": ["demo-gpt", "demo-alias"]})
    data["models"].append({"name": "demo-alias", "deployments": [
        {"cluster": CLUSTER, "protocol": "openai", "endpoints": data["models"][0]["deployments"][0]["endpoints"],
         "upstream_model": "demo-gpt"}]})
    data["ratelimit"]["limits"][0].update(rate=1000, burst=1000)
    data["models"][0]["deployments"][0]["max_inflight"] = 16
    return data


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    base = _base()
    with start_stack(tmp_path_factory.mktemp("live-reload"), base) as stack:
        stack.base = yaml.safe_load(stack.config_path.read_text())  # as start_stack wrote it
        port = int(base["extproc"]["metrics_address"].rpartition(":")[2])
        stack.metrics = [f"http://127.0.0.1:{port + i}/metrics" for i in range(2)]
        stack.pids = _pids(stack)
        load = Load(stack.url)
        stack.load = load
        load.start()
        try:
            yield stack
        finally:
            load.stop()


def _pids(stack) -> tuple[int, int, tuple[int, ...]]:
    serve = stack.child("extproc").proc.pid
    workers = tuple(sorted(int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                           if _ppid(p) == serve))
    return stack.child("envoy").proc.pid, serve, workers


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _apply(stack, data: dict[str, Any] | str) -> str:
    """Write the file and SIGHUP `serve` (it passes the signal to its workers); the file's version."""
    text = data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False)
    stack.config_path.write_text(text)
    os.kill(stack.child("extproc").proc.pid, signal.SIGHUP)
    return config_version(text.encode())


def _chat(url: str, key: str, model: str = "demo-gpt", text: str = "hi") -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": text}]}, timeout=30)


def _within(cond, seconds: float = WITHIN_S) -> float:
    """Seconds until `cond()` held (asserts it does within `seconds`)."""
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < seconds, "not within the bound"
        time.sleep(0.05)
    return time.monotonic() - start


def _versions(stack) -> list[set[str]]:
    return [_versions_at(url) for url in stack.metrics]


def _two_holds(url: str) -> tuple[list[float], float]:
    """Two calls that each hold the upstream 400 ms, sent together: their waits for a slot (ms), least
    first, and the seconds from the first send to the last answer."""
    def call(_: int) -> tuple[httpx.Response, float, float]:
        sent = time.monotonic()
        reply = _chat(url, DEMO_KEY, text="demo-hold-400")
        return reply, sent, time.monotonic()

    with ThreadPoolExecutor(2) as pool:
        calls = list(pool.map(call, range(2)))
    assert [r.status_code for r, _, _ in calls] == [200, 200]
    waits = sorted(float(r.headers["x-modelyard-queue-wait-ms"]) for r, _, _ in calls)
    return waits, max(end for _, _, end in calls) - min(sent for _, sent, _ in calls)


def _one_slot(url: str) -> bool:
    # One slot: the holds run one after the other (at least 0.8 s end to end), so one of them queued. How
    # long it queued is 400 ms less the gap between the arrivals, which a busy box stretches: no bound.
    waits, span = _two_holds(url)
    return waits[1] > 0.0 and span >= 0.8


def _load_clean(stack) -> None:
    seen = stack.load.seen()
    assert set(seen) == {200} and seen[200] > 0, seen


def test_sighup_applies_tenants_models_limits_and_max_inflight_under_load(live) -> None:
    base = live.base
    assert _versions(live) == [{config_version(live.config_path.read_bytes())}] * 2
    assert _chat(live.url, NEW_KEY).status_code == 401
    assert _chat(live.url, DEMO_KEY, "demo-alias").status_code == 404
    limited = [_chat(live.url, LIMITED).status_code for _ in range(2)]
    assert limited == [200, 429]
    assert _one_slot(live.url)

    version = _apply(live, _changed(base))
    took = _within(lambda: all(_chat(live.url, NEW_KEY).status_code == 200 for _ in range(4)))
    _within(lambda: _chat(live.url, DEMO_KEY, "demo-alias").status_code == 200)
    reply = _chat(live.url, NEW_KEY, "demo-alias")
    assert reply.status_code == 200 and reply.headers["x-modelyard-cluster"] == CLUSTER
    _within(lambda: _versions(live) == [{version}] * 2)  # every worker, not only the one signalled
    _within(lambda: _chat(live.url, LIMITED).status_code == 200)  # the faster limit
    assert _two_holds(live.url)[0] == [0.0, 0.0]  # 16 slots now: nobody waits
    print(f"new tenant answered {took:.2f}s after SIGHUP")
    _load_clean(live)
    assert _pids(live) == live.pids


def test_broken_file_is_refused_and_a_removal_takes_effect_under_load(live) -> None:
    changed = _changed(live.base)
    version = _apply(live, changed)
    _within(lambda: _versions(live) == [{version}] * 2)
    assert _chat(live.url, NEW_KEY).status_code == 200

    _apply(live, yaml.safe_dump(changed, sort_keys=False) + "\ntenants: [this is: not, a config\n")
    time.sleep(1.0)  # give a wrong apply every chance to show
    assert _versions(live) == [{version}] * 2
    assert all(_chat(live.url, NEW_KEY).status_code == 200 for _ in range(4))
    assert _chat(live.url, DEMO_KEY, "demo-alias").status_code == 200

    removed = _apply(live, live.base)
    _within(lambda: all(_chat(live.url, NEW_KEY).status_code == 401 for _ in range(4)))
    _within(lambda: _chat(live.url, DEMO_KEY, "demo-alias").status_code == 404)
    _within(lambda: _versions(live) == [{removed}] * 2)
    assert _one_slot(live.url)  # back to one slot
    _load_clean(live)
    assert _pids(live) == live.pids


def test_a_serving_extproc_applies_the_control_planes_config_and_acks(tmp_path: Path) -> None:
    """`controlplane.enabled`: a real `modelyard serve` long-polls a minimal control plane (the contract's
    paths, tests/live_control_plane.py), applies what it offers and acks it; a broken text is refused, acked
    with the reason, and the running version stays."""
    with ControlPlane.thread() as cp:
        data = small_config()
        data["extproc"].update(address=f"127.0.0.1:{free_port()}", metrics_address=f"127.0.0.1:{free_port()}",
                               workers=1, metering_db=None, audit_db=None, tasks=None, batches=None)
        data["controlplane"] = {"enabled": True, "api_address": cp.address}
        path = tmp_path / "modelyard.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        metrics = f"http://{data['extproc']['metrics_address']}/metrics"
        proc = subprocess.Popen([sys.executable, "-m", "modelyard.cli", "serve", "--config", str(path)],
                                stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.log").open("wb"))
        try:
            _within(lambda: _serving(metrics), 60)
            assert _versions_at(metrics) == {config_version(path.read_bytes())}
            _within(lambda: any(p.get("have") == config_version(path.read_bytes()) for p in list(cp.polls)), 10)

            offered = copy.deepcopy(data)
            offered["tenants"].append({"name": "newcomer", "api_keys": [hash_api_key(NEW_KEY)]})
            version = cp.offer(yaml.safe_dump(offered, sort_keys=False).encode())
            _within(lambda: bool(cp.acks_for(version)), 10)
            ack = cp.acks_for(version)[-1]
            assert ack["ok"] is True and ack["error"] == "" and ack["worker"].split("/")[1:] == [str(proc.pid), "0"]
            assert _versions_at(metrics) == {version}

            broken = cp.offer(b"models: [this is: not, a config\n")
            _within(lambda: bool(cp.acks_for(broken)), 10)
            assert cp.acks_for(broken)[-1]["ok"] is False and "YAML" in cp.acks_for(broken)[-1]["error"]
            assert _versions_at(metrics) == {version} and proc.poll() is None
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def _serving(metrics: str) -> bool:
    try:
        return httpx.get(metrics, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _versions_at(metrics: str) -> set[str]:
    text = httpx.get(metrics, timeout=5).text
    return {ln.split('version="', 1)[1].split('"', 1)[0] for ln in text.splitlines()
            if ln.startswith("modelyard_config_info{") and ln.rstrip().endswith(" 1.0")}
