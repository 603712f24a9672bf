"""`modelyard epp` learning its InferencePool's replicas from the Kubernetes API, through a real
Envoy configured as the Inference Extension documents (the same gateway as
test_endpoint_picker.py): it reads the pool, lists and watches the pods it selects and the
InferenceObjectives, and the picks follow. The API is tests/kube_apiserver.py, a stand-in serving
recorded real responses (no kube-apiserver installs here: tests/replicas/kube/SOURCES.md).

The pool's pods are demo model servers on 127.0.0.2-4 at one port (pods have their own IPs and
share the pool's targetPort); each answer says which one served it."""

from __future__ import annotations

import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import yaml

from tests.inference_gateway import Gateway, gateway_processes, inference_gateway_envoy
from tests.inference_gateway import chat as _chat
from tests.inference_gateway import client as _client
from tests.inference_gateway import fake as _fake
from tests.inference_gateway import settle as _settle
from tests.kube_apiserver import OBJECTIVES, PODS, POOLS, KubeApiStandIn
from tests.stack_config import free_port

IPS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def _port_free_on_every_ip() -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((IPS[0], 0))
            port = s.getsockname()[1]
        try:
            for ip in IPS:
                with socket.socket() as s:
                    s.bind((ip, port))
            return int(port)
        except OSError:
            continue
    raise AssertionError("no port free on all of 127.0.0.2-4")


@dataclass
class Pool:
    gw: Gateway
    api: KubeApiStandIn
    a: str
    b: str
    c: str
    metrics: str

    def polled(self) -> set[str]:
        """The endpoints the picker holds state for (`modelyard_replica_state`, from its board)."""
        text = httpx.get(self.metrics, timeout=5).text
        return {ep for ep in (self.a, self.b, self.c)
                if f'modelyard_replica_state{{cluster="demo-pool",endpoint="{ep}"' in text}


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    work = tmp_path_factory.mktemp("epp-kube")
    port = _port_free_on_every_ip()
    a, b, c = (f"{ip}:{port}" for ip in IPS)
    api = KubeApiStandIn("modelyard", "demo-pool", {"app.kubernetes.io/name": "vllm-demo"}, port).start()
    api.put_pod("vllm-demo-a", IPS[0])
    api.put_pod("vllm-demo-b", IPS[1])
    api.put_pod("not-in-the-pool", "127.0.0.9", labels={"app": "other"})  # the selector leaves it out
    epp_port, listen, admin, metrics = free_port(), free_port(), free_port(), free_port()
    (work / "epp.yaml").write_text(yaml.safe_dump({
        "pool": "demo-pool", "address": f"127.0.0.1:{epp_port}", "metrics_address": f"127.0.0.1:{metrics}",
        "kubernetes": {"api_server": api.url, "namespace": "modelyard", "backoff_max_s": 1.0},
        "replica_metrics": {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 400}, "shed_queue": 10}))
    (work / "envoy.yaml").write_text(yaml.safe_dump(inference_gateway_envoy(listen, admin, epp_port, [a, b])))
    demos: list[str] = []
    for ip in IPS:
        demos += ["--", "devstack.demo.openai_server", "--host", ip, "--port", str(port)]
    try:
        with gateway_processes(work, demos[1:], None, epp_port, listen):  # pods on 127.0.0.2-4: not waited for
            api.wait_for(lambda: api.watches(PODS) and api.watches(OBJECTIVES))
            yield Pool(Gateway(f"http://127.0.0.1:{listen}", [a, b]), api, a, b, c,
                       f"http://127.0.0.1:{metrics}/metrics")
    finally:
        api.stop()


def _landed(client: openai.OpenAI, n: int = 10) -> Counter[str]:
    return Counter(_chat(client, [{"role": "user", "content": f"k{i}"}]) for i in range(n))


def _settle_off(client: openai.OpenAI, avoid: str, limit_s: float = 10.0) -> None:
    """Calls until one lands elsewhere than `avoid` (the picker has seen the change). Endpoints that
    (re)join the pool are not ready until their first reading (50 ms): 503 till then, as `_settle`."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if _chat(client, [{"role": "user", "content": "off"}]) != avoid:
                return
        except openai.InternalServerError as e:
            assert e.status_code == 503, e
        assert time.monotonic() < deadline, f"still landing on {avoid}"


def _shed_eventually(client: openai.OpenAI, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    with pytest.raises(openai.RateLimitError) as e:
        while time.monotonic() < deadline:
            _chat(client, [{"role": "user", "content": "x"}])
    assert e.value.status_code == 429 and "sheddable" in e.value.message


def _served_eventually(client: openai.OpenAI, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while True:
        try:
            _chat(client, [{"role": "user", "content": "y"}])
            return
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "still shed"


def test_the_pools_pods_come_from_the_api(pool: Pool) -> None:
    client = _client(pool.gw)
    _fake(pool.a, waiting=8, metrics=True)
    _fake(pool.b, waiting=0, metrics=True)
    _settle(client, pool.b)
    assert _landed(client) == {pool.b: 10}
    _fake(pool.a, waiting=0)
    _fake(pool.b, waiting=8)
    _settle(client, pool.a)
    assert _landed(client) == {pool.a: 10}
    # It watches the pool, listed the pods its selector names, and watches them from the list's version.
    assert pool.api.watches(POOLS)[0]["fieldSelector"] == "metadata.name=demo-pool"
    [listed] = [q for c, q in pool.api.requests if c == PODS and q.get("watch") != "1"]
    assert listed["labelSelector"] == "app.kubernetes.io/name=vllm-demo"
    first = pool.api.watches(PODS)[0]
    assert first["allowWatchBookmarks"] == "true" and first["labelSelector"] == listed["labelSelector"]
    assert int(first["resourceVersion"]) >= 1003


def test_a_pod_added_is_picked_and_one_not_ready_or_deleted_is_not(pool: Pool) -> None:
    client = _client(pool.gw)
    _fake(pool.a, waiting=8, metrics=True)
    _fake(pool.b, waiting=8, metrics=True)
    _fake(pool.c, waiting=0, metrics=True)
    assert pool.c not in _landed(client)  # c serves, but is no pod of the pool yet
    assert pool.polled() == {pool.a, pool.b}
    pool.api.put_pod("vllm-demo-c", IPS[2])
    _settle(client, pool.c)  # its first reading comes 50 ms after the watch event
    assert _landed(client) == {pool.c: 10}
    assert pool.polled() == {pool.a, pool.b, pool.c}
    pool.api.put_pod("vllm-demo-c", IPS[2], ready=False)  # its readiness probe fails
    _settle_off(client, pool.c)
    assert pool.c not in _landed(client)
    pool.api.put_pod("vllm-demo-c", IPS[2])
    _settle(client, pool.c)
    pool.api.delete_pod("vllm-demo-c")
    _settle_off(client, pool.c)
    assert pool.c not in _landed(client)
    assert pool.polled() == {pool.a, pool.b}  # its reading and poller are gone with it


def test_a_watch_the_server_closes_resumes_without_losing_events(pool: Pool) -> None:
    client = _client(pool.gw)
    _fake(pool.a, waiting=8, metrics=True)
    _fake(pool.b, waiting=8, metrics=True)
    _fake(pool.c, waiting=0, metrics=True)
    lists, watches = pool.api.lists(PODS), len(pool.api.watches(PODS))
    rv = pool.api.rv
    pool.api.hold_watches()
    pool.api.close_watches()
    pool.api.wait_for(lambda: len(pool.api.watches(PODS)) > watches)  # it reconnected, and waits
    pool.api.put_pod("vllm-demo-c", IPS[2])  # while no watch is open
    pool.api.release_watches()
    _settle(client, pool.c)
    assert _landed(client) == {pool.c: 10}
    assert pool.api.lists(PODS) == lists  # resumed, not listed again
    assert int(pool.api.watches(PODS)[-1]["resourceVersion"]) >= rv


def test_a_410_lists_again(pool: Pool) -> None:
    client = _client(pool.gw)
    lists, watches = pool.api.lists(PODS), len(pool.api.watches(PODS))
    pool.api.hold_watches()
    pool.api.close_watches()
    pool.api.wait_for(lambda: len(pool.api.watches(PODS)) > watches)
    pool.api.delete_pod("vllm-demo-c")
    pool.api.expire()  # that deletion is compacted away: only a new list shows it
    pool.api.release_watches()
    pool.api.wait_for(lambda: pool.api.lists(PODS) == lists + 1)
    _settle_off(client, pool.c)
    assert pool.c not in _landed(client)


def test_the_pools_own_edits_are_watched(pool: Pool) -> None:
    client = _client(pool.gw)
    for ep in (pool.a, pool.b, pool.c):
        _fake(ep, waiting=0, metrics=True)
    lists = pool.api.lists(PODS)
    pool.api.put_pod("canary", IPS[2], labels={"app.kubernetes.io/name": "vllm-canary"})
    assert pool.c not in _landed(client)  # a pod the selector does not name
    pool.api.put_pool(selector={"app.kubernetes.io/name": "vllm-canary"})  # now it names only that one
    _settle(client, pool.c)
    assert _landed(client) == {pool.c: 10}
    pool.api.wait_for(lambda: pool.api.lists(PODS) == lists + 1)  # a new selector: a new list, not a patch
    last = [q for c, q in pool.api.requests if c == PODS and q.get("watch") != "1"][-1]
    assert last["labelSelector"] == "app.kubernetes.io/name=vllm-canary"
    pool.api.put_pool(selector={"app.kubernetes.io/name": "vllm-demo"})
    _settle_off(client, pool.c)
    assert pool.c not in _landed(client)
    pool.api.delete_pod("canary")


def test_inference_objectives_from_the_api_decide_what_is_shed(pool: Pool) -> None:
    _fake(pool.a, waiting=30, metrics=True)
    _fake(pool.b, waiting=20, metrics=True)
    batch = _client(pool.gw, **{"x-gateway-inference-objective": "batch-jobs"})
    _settle(batch, pool.b)  # no such objective yet: priority 0, served though saturated
    pool.api.put_objective("batch-jobs", -1)
    _shed_eventually(batch)
    pool.api.put_objective("batch-jobs", 1)  # raised: served again
    _served_eventually(batch)
    pool.api.put_objective("batch-jobs", -1)
    _shed_eventually(batch)
    pool.api.put_objective("batch-jobs", -1, pool="another-pool")  # now names another pool: not ours
    _served_eventually(batch)
    _fake(pool.a, waiting=0)
    _fake(pool.b, waiting=0)


def test_modelyard_up_runs_the_demo_api_and_the_picker_watches_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The shipped shape: `devstack.demo_kube_api` makes `up` run devstack/demo/kube_api.py at
    `endpoint_picker.kubernetes.api_server`, one pod serving both demo engines (two target ports);
    the picker takes its replicas from there, and a pod marked NotReady there leaves the pool."""
    from tests.stack_config import small_config, start_stack

    data = small_config()
    p1, p2, kube = free_port(), free_port(), free_port()
    eps = [f"127.0.0.1:{p1}", f"127.0.0.1:{p2}"]
    data["models"].append({"name": "pooled", "task_types": ["chat"], "deployments": [{
        "cluster": "demo-pooled", "protocol": "openai", "endpoints": eps}]})
    listener = f"127.0.0.1:{free_port()}"
    data["endpoint_picker"] = {"pool": "demo-pool", "address": f"127.0.0.1:{free_port()}", "listener": listener,
                               "kubernetes": {"api_server": f"http://127.0.0.1:{kube}", "namespace": "demo"},
                               "replica_metrics": {"kind": "vllm", "interval_ms": 50}}
    data.setdefault("devstack", {})["demo_kube_api"] = {"target_ports": [p1, p2], "pods": {"demo-vllm-0": "127.0.0.1"}}
    with start_stack(tmp_path_factory.mktemp("epp-up-kube"), data, shared_demos=True) as stack:
        assert stack.child("kube-api").is_ready() and stack.child("epp").is_ready()
        client = _client(Gateway(f"http://{listener}", eps))
        _fake(eps[0], waiting=6)
        _settle(client, eps[1])
        assert _landed(client) == {eps[1]: 10}
        httpx.post(f"http://127.0.0.1:{kube}/demo/pods/demo-vllm-0", json={"ready": False}, timeout=5).raise_for_status()
        deadline = time.monotonic() + 10
        with pytest.raises(openai.InternalServerError) as e:  # its only pod NotReady: no replica at all
            while time.monotonic() < deadline:
                _chat(client, [{"role": "user", "content": "anyone?"}])
        assert e.value.status_code == 503 and "no ready endpoint" in e.value.message
        httpx.post(f"http://127.0.0.1:{kube}/demo/pods/demo-vllm-0", json={"ready": True}, timeout=5).raise_for_status()
        _settle(client, eps[1])
        _fake(eps[0], waiting=0)
