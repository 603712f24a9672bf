"""Live configuration through a real Envoy fed by `modelyard controlplane` over ADS, under load:
4 clients call demo-gpt without pause while configs are applied; none of their calls fails and
Envoy's process is never replaced.

The extproc starts with the added model already in its own config, absent from Envoy's, so Envoy's
part is proven on its own (new cluster, moved endpoint, removed cluster) by an extproc that reads its
config once. An extproc that subscribes to the control plane (the reload side of issue 29) takes the
control plane's config at once instead; the test sees it among the subscribers and then also expects
what only that extproc can do: the new tenant's key answers, and the removed model is a 404. A
minimal subscriber thread speaks the extproc's side of contracts/live_config.py either way, so every
apply also waits for a worker's ack.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from contracts.config import hash_api_key
from contracts.live_config import ACK_PATH, APPLY_PATH, CONFIG_PATH, STATUS_PATH, config_version
from devstack.child import Child
from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack

CLIENTS = 4
NEW_KEY = "sk-live-tenant"
MAX_LOAD_S = 60.0  # a bound, not the plan: the scenario takes 10-20 s
NEW_CLUSTER = "demo-new"


def chat(client: httpx.Client, url: str, model: str, key: str = DEMO_KEY) -> httpx.Response:
    return client.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                       json={"model": model, "messages": [{"role": "user", "content": "hi"}]}, timeout=10)


def dump(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


class Load:
    """CLIENTS threads calling demo-gpt back to back; every status and which upstream answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.statuses: list[int] = []
        self.failures: list[str] = []
        self.answered_by: list[str] = []
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        deadline = time.monotonic() + MAX_LOAD_S
        with httpx.Client() as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                try:
                    r = chat(client, self.url, "demo-gpt")
                except httpx.HTTPError as e:
                    with self._lock:
                        self.failures.append(repr(e))
                    continue
                with self._lock:
                    self.statuses.append(r.status_code)
                    if r.status_code != 200:
                        self.failures.append(f"{r.status_code} {r.text[:200]}")
                    else:
                        self.answered_by.append(r.json()["choices"][0]["message"]["content"].split("]")[0] + "]")

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=15)


class Subscriber(threading.Thread):
    """The extproc's side of the long poll, minimal: take the version, ack it."""

    def __init__(self, api: str, have: str) -> None:
        super().__init__(daemon=True)
        self.api, self.have, self.stop = api, have, threading.Event()
        self.versions: list[str] = []

    def run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.stop.is_set():
                try:
                    r = client.get(self.api + CONFIG_PATH, params={"have": self.have, "worker": "test-subscriber",
                                                                   "wait": "1"})
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                if r.status_code == 200:
                    version = r.json()["version"]
                    client.post(self.api + ACK_PATH, json={"worker": "test-subscriber", "version": version,
                                                           "ok": True, "error": ""})
                    self.have = version
                    self.versions.append(version)


def until(check: Callable[[], bool], within: float) -> float:
    """Seconds until `check()` held; fails past `within`."""
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < within, f"not within {within}s"
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("live")
    data = small_config()
    data["extproc"].update(audit_db="audit.sqlite", metering_db=None, tasks=None, batches=None)
    data["models"][0]["deployments"][0].pop("warmup", None)
    api = f"127.0.0.1:{free_port()}"
    data["controlplane"] = {"enabled": True, "xds_address": f"127.0.0.1:{free_port()}", "api_address": api}
    other = f"127.0.0.1:{free_port()}"  # a second demo upstream: the new cluster's, then demo-openai's
    new_model = {**data["models"][0], "name": "demo-new", "groups": [], "deployments": [
        {"cluster": NEW_CLUSTER, "protocol": "openai", "endpoints": [other]}]}
    stack = start_stack(workdir, data)
    # The extproc knows demo-new from the start; Envoy (the control plane's file) does not.
    extproc_cfg = workdir / "modelyard-extproc.yaml"
    extproc_cfg.write_text(yaml.safe_dump({**data, "models": [*data["models"], new_model]}, sort_keys=False))
    ext = stack.child("extproc")
    ext.argv = [*ext.argv[:-1], str(extproc_cfg)]
    ext.standby_argv = None
    host, _, port = other.rpartition(":")
    stack.children.insert(0, Child("demo-openai-b", [sys.executable, "-m", "devstack.demo.openai_server", "--host", host,
                                                     "--port", port, "--name", "demo-openai-b"],
                                   ("http", f"http://{other}/health")))
    with stack:
        yield {"stack": stack, "data": data, "new_model": new_model, "other": other, "api": f"http://{api}",
               "path": workdir / "modelyard.yaml", "workdir": workdir}


def audit_details(db: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return [d for (d,) in conn.execute("SELECT detail FROM audit WHERE event = 'config_reload'")]


def test_apply_under_load_loses_no_request(live: dict[str, Any]) -> None:
    stack, data, api = live["stack"], live["data"], live["api"]
    envoy_pid = stack.child("envoy").proc.pid
    subscriber = Subscriber(api, config_version(live["path"].read_bytes()))
    subscriber.start()
    probe = httpx.Client()
    tenant = {"name": "live-tenant", "tier": "L2", "api_keys": [f"sha256:{hash_api_key(NEW_KEY)}"],
              "allowed_models": ["*"]}
    added = {**data, "models": [*data["models"], live["new_model"]], "tenants": [*data["tenants"], tenant]}

    def apply(cfg: dict[str, Any] | bytes) -> httpx.Response:
        return httpx.post(api + APPLY_PATH, content=cfg if isinstance(cfg, bytes) else dump(cfg), timeout=30,
                          headers={"x-modelyard-applied-by": "ops@e2e"})

    def stat(name: str) -> int:
        found = httpx.get(f"{stack.admin_url()}/stats?filter=^{name}$&format=json", timeout=5).json()["stats"]
        return int(found[0]["value"])

    def new_model_answers() -> bool:
        return chat(probe, stack.url, "demo-new").status_code == 200

    try:
        before = chat(probe, stack.url, "demo-new")
        # Envoy has no such cluster yet (its 503, as a 502); a subscribed extproc has no such model (404).
        assert before.status_code in (404, 502), before.text
        with Load(stack.url) as load:
            until(lambda: len(load.statuses) >= 8, 30)

            # A model on a new cluster: answers within 3 s of the apply.
            t0 = time.monotonic()
            r = apply(added)
            assert r.status_code == 200, r.text
            timings = {"add: apply": time.monotonic() - t0}
            until(new_model_answers, 3 - (time.monotonic() - t0))
            timings["add: answers"] = time.monotonic() - t0
            workers = {w["worker"] for w in httpx.get(api + STATUS_PATH).json()["workers"]}
            extproc_subscribes = bool(workers - {"test-subscriber"})
            assert extproc_subscribes, workers  # the stack's own extproc takes its config from the control plane
            assert chat(probe, stack.url, "demo-gpt", key=NEW_KEY).status_code == 200
            # The extproc's audit log says who applied which version.
            until(lambda: any(json.loads(d).get("applied_by") == "ops@e2e" and json.loads(d)["version"]
                              == r.json()["version"] for d in audit_details(live["workdir"] / "audit.sqlite")), 5)
            assert subscriber.versions[-1] == r.json()["version"] == config_version(dump(added))

            # A config Envoy refuses (a CA file that is not there): reported, the last good one stays.
            refused = {**added, "models": [*added["models"], {**live["new_model"], "name": "demo-bad", "deployments": [
                {"cluster": "demo-bad", "protocol": "openai", "endpoints": [live["other"]], "tls": True,
                 "tls_ca_file": "/nonexistent/ca.pem"}]}]}
            r = apply(refused)
            assert r.status_code == 422, r.text
            assert "/nonexistent/ca.pem" in r.json()["error"]
            st = httpx.get(api + STATUS_PATH).json()
            assert st["version"] == config_version(dump(added))
            assert "/nonexistent/ca.pem" in st["envoy"]["nack"]["error"]
            assert until(lambda: httpx.get(api + STATUS_PATH).json()["envoy"]["streams"][0]["version"]
                         == config_version(dump(added)), 3) >= 0
            assert new_model_answers()

            # A file that does not validate: refused, nothing changes.
            r = apply(b"models: [")
            assert r.status_code == 400 and "not valid YAML" in r.json()["error"]
            assert httpx.get(api + STATUS_PATH).json()["version"] == config_version(dump(added))

            # demo-openai's endpoint moves to the other upstream: demo-gpt's answers come from there.
            moved = yaml.safe_load(dump(added))
            moved["models"][0]["deployments"][0]["endpoints"] = [live["other"]]
            mark = len(load.answered_by)
            t0 = time.monotonic()
            r = apply(moved)
            assert r.status_code == 200, r.text
            assert httpx.get(api + STATUS_PATH).json()["envoy"]["nack"] is None  # a good apply clears it
            until(lambda: "[demo-openai-b]" in load.answered_by[mark:], 3 - (time.monotonic() - t0))
            timings["move: answered from the new endpoint"] = time.monotonic() - t0

            # A cluster's own settings change (its LB policy): Envoy rebuilds it, and the rebuilt one
            # gets its endpoints (pushed after the clusters) instead of warming forever.
            updated = stat("cluster_manager.cluster_modified")
            moved["models"][0]["deployments"][0]["lb"] = {"policy": "least_request"}
            r = apply(moved)
            assert r.status_code == 200, r.text
            until(lambda: stat("cluster_manager.cluster_modified") > updated
                  and stat("cluster_manager.warming_clusters") == 0, 3)
            assert "[demo-openai]" in load.answered_by[:mark]

            # The model's cluster goes: within 3 s nothing answers for it.
            removed = {**moved, "models": moved["models"][:1], "tenants": moved["tenants"][:-1]}
            gone_status = 404 if extproc_subscribes else 502
            t0 = time.monotonic()
            r = apply(removed)
            assert r.status_code == 200, r.text
            # 502 (Envoy: no such cluster) from an extproc that still knows the model; 404 from one
            # that takes its config from the control plane too.
            seen: list[str] = []

            def gone() -> bool:
                reply = chat(probe, stack.url, "demo-new")
                seen.append(f"{reply.status_code} {reply.text[:160]}")
                return reply.status_code == gone_status

            try:
                until(gone, 3 - (time.monotonic() - t0))
            except AssertionError:
                raise AssertionError(f"demo-new still answers: {seen[-3:]}") from None
            timings["remove: gone"] = time.monotonic() - t0
            assert chat(probe, stack.url, "demo-gpt", key=NEW_KEY).status_code == 401
            until(lambda: len(load.statuses) >= mark + 8, 10)
        print(f"\nlive config under load ({'extproc subscribed' if extproc_subscribes else 'Envoy side only'}): "
              f"{len(load.statuses)} requests by {CLIENTS} clients, statuses "
              f"{sorted(set(load.statuses))}; " + ", ".join(f"{k} {v:.2f}s" for k, v in timings.items()))
        assert load.statuses, "no load ran"
        assert not load.failures, load.failures[:5]
        assert set(load.statuses) == {200}
        assert stack.child("envoy").proc.pid == envoy_pid and stack.child("envoy").proc.poll() is None
    finally:
        subscriber.stop.set()
        probe.close()


def test_cli_apply_refuses_a_broken_file_and_status_shows_the_version(live: dict[str, Any]) -> None:
    broken = live["workdir"] / "broken.yaml"
    broken.write_text("models: [")
    r = subprocess.run([sys.executable, "-m", "modelyard.cli", "apply", str(broken)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1
    assert "refused, nothing changed" in r.stderr and "not valid YAML" in r.stderr
    st = subprocess.run([sys.executable, "-m", "modelyard.cli", "status", "--config", str(live["path"])],
                        capture_output=True, text=True, timeout=60)
    running = httpx.get(live["api"] + STATUS_PATH).json()["version"]
    assert st.stdout.startswith(f"version {running}"), st.stdout + st.stderr
    assert "envoy modelyard-envoy" in st.stdout
    metrics = httpx.get(live["api"] + "/metrics").text
    assert f'modelyard_config_info{{version="{running}"}} 1.0' in metrics


def test_serving_rides_out_a_control_plane_restart(live: dict[str, Any]) -> None:
    """SIGKILL the control plane under load: Envoy and the extproc keep serving what they have; the
    restarted one serves its file again, Envoy reconnects, and an apply works as before."""
    stack, api = live["stack"], live["api"]
    envoy_pid = stack.child("envoy").proc.pid
    started_with = config_version(live["path"].read_bytes())
    with Load(stack.url) as load:
        until(lambda: len(load.statuses) >= 8, 30)
        cp = stack.child("controlplane")
        cp.proc.kill()
        cp.proc.wait()
        mark = len(load.statuses)
        until(lambda: len(load.statuses) >= mark + 20, 15)  # served while it is gone
        stack.restart("controlplane")

        def envoy_back() -> bool:
            streams = httpx.get(api + STATUS_PATH).json()["envoy"]["streams"]
            return [s["version"] for s in streams] == [started_with]

        until(envoy_back, 30)  # Envoy's ADS retry finds it
        moved = yaml.safe_load(live["path"].read_text())
        moved["models"][0]["deployments"][0]["endpoints"] = [live["other"]]
        r = httpx.post(api + APPLY_PATH, content=dump(moved), timeout=30)
        assert r.status_code == 200, r.text
        mark = len(load.answered_by)
        until(lambda: "[demo-openai-b]" in load.answered_by[mark:], 3)
    assert not load.failures, load.failures[:5]
    assert set(load.statuses) == {200}
    assert stack.child("envoy").proc.pid == envoy_pid
