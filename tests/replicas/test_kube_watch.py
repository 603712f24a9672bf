"""The endpoint picker's pod and InferenceObjective watch, sans-I/O: list and watch decoding
(extproc/epp/watch.py) and what counts as a replica (extproc/epp/cluster.py), on responses a real
kube-apiserver served (tests/replicas/kube/SOURCES.md), and the API access it resolves."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.config.endpoint_picker import KubernetesSource
from extproc.epp import cluster
from extproc.epp.kubeapi import AccessError, api_path, resolve_access
from extproc.epp.watch import Collection, Expired, WatchFailed

HERE = Path(__file__).parent / "kube"
LIFE = json.loads((HERE / "pulumi-pod-createSuccess.json").read_text())  # Pending ... Running+Ready
UNREADY = json.loads((HERE / "pulumi-pod-unready.json").read_text())
READY = json.loads((HERE / "pulumi-pod-ready.json").read_text())
EXPIRED, BOOKMARK = (HERE / "watch-frames.jsonl").read_bytes().splitlines()
POOL = cluster.PoolSpec((("app.kubernetes.io/managed-by", "pulumi"),), (8000,))


def _frames(kind: str, objs: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps({"type": kind, "object": o}).encode() + b"\n" for o in objs)


def _stream(objs: list[dict[str, Any]]) -> bytes:
    """A watch's bytes for a recorded object sequence: the first ADDED, the rest MODIFIED."""
    return _frames("ADDED", objs[:1]) + _frames("MODIFIED", objs[1:])


def _list(items: list[dict[str, Any]], rv: str) -> bytes:
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": rv},
                       "items": items}).encode()


def test_a_recorded_pod_becomes_a_replica_only_once_running_and_ready() -> None:
    coll = Collection()
    coll.replace(_list([], "389615"))
    seen = []
    for i in range(len(LIFE)):
        coll.feed(_stream(LIFE)[len(_stream(LIFE[:i])):len(_stream(LIFE[:i + 1]))])
        seen.append(cluster.pool_endpoints(coll.items.values(), POOL))
    assert seen == [[], [], [], ["10.1.3.217:8000"]]
    assert coll.resource_version == "389626"


def test_the_stream_may_be_cut_anywhere() -> None:
    data = _stream(LIFE) + BOOKMARK + b"\n"
    for size in (1, 7, 64, 1000):
        coll = Collection()
        coll.replace(_list([], "1"))
        changed = sum(coll.feed(data[i:i + size]) for i in range(0, len(data), size))
        assert changed == len(LIFE)
        assert cluster.pool_endpoints(coll.items.values(), POOL) == ["10.1.3.217:8000"]
        assert coll.resource_version == "3845"  # the bookmark's


def test_a_line_cut_off_by_a_closed_watch_is_dropped_and_comes_again() -> None:
    coll = Collection()
    coll.replace(_list(LIFE[:1], "389616"))
    whole = _frames("MODIFIED", LIFE[-1:])
    coll.feed(whole[:40])  # the server closed the watch mid-line
    coll.start_watch()  # resumed from 389616: the event is sent again
    assert coll.feed(whole) == 1
    assert cluster.pool_endpoints(coll.items.values(), POOL) == ["10.1.3.217:8000"]


def test_not_ready_deleted_or_being_deleted_is_no_replica() -> None:
    coll = Collection()
    coll.replace(_list([READY], "389626"))
    assert cluster.pool_endpoints(coll.items.values(), POOL) == ["10.1.3.217:8000"]
    coll.feed(_stream(UNREADY))  # the same pod (default/foo) back to Pending, Ready False
    assert cluster.pool_endpoints(coll.items.values(), POOL) == []
    coll.feed(_frames("MODIFIED", [READY]))
    terminating = copy.deepcopy(READY)
    terminating["metadata"]["deletionTimestamp"] = "2019-06-25T05:00:00Z"
    coll.feed(_frames("MODIFIED", [terminating]))
    assert cluster.pool_endpoints(coll.items.values(), POOL) == []
    coll.feed(_frames("MODIFIED", [READY]))
    assert coll.feed(_frames("DELETED", [READY])) == 1
    assert coll.items == {} and cluster.pool_endpoints(coll.items.values(), POOL) == []


def test_a_pod_the_selector_does_not_match_or_without_an_ip_is_no_replica() -> None:
    other = cluster.PoolSpec((("app", "vllm"),), (8000,))
    assert cluster.pod_endpoints(READY, other) == []
    no_ip = copy.deepcopy(READY)
    del no_ip["status"]["podIP"]
    assert cluster.pod_endpoints(no_ip, POOL) == []
    v6 = copy.deepcopy(READY)
    v6["status"]["podIP"] = "fd00::1"
    assert cluster.pod_endpoints(v6, cluster.PoolSpec(POOL.selector, (8000, 8001))) == ["[fd00::1]:8000",
                                                                                       "[fd00::1]:8001"]


def test_kubectls_pod_list_from_minikube() -> None:
    doc = json.loads((HERE / "kubectl-get-pods-minikube.json").read_text())
    pool = cluster.PoolSpec((("app", "work-queue"), ("component", "queue")), (8080,))
    assert cluster.pool_endpoints(doc["items"], pool) == ["172.17.0.6:8080"]
    with pytest.raises(WatchFailed, match="resourceVersion"):  # kubectl's List has none to watch from
        Collection().replace(doc)


def test_the_recorded_410_means_list_again() -> None:
    coll = Collection()
    coll.replace(_list([READY], "389626"))
    with pytest.raises(Expired, match="too old resource version"):
        coll.feed(EXPIRED + b"\n")
    coll.expire()
    assert coll.resource_version is None
    assert coll.items  # the last known pods stay until the new list replaces them
    coll.replace(_list([], "3171407"))
    assert coll.items == {} and coll.resource_version == "3171407"


def test_the_recorded_bookmark_moves_the_version_only() -> None:
    coll = Collection()
    coll.replace(_list([READY], "389626"))
    assert coll.feed(BOOKMARK + b"\n") == 0
    assert coll.resource_version == "3845" and list(coll.items) == ["default/foo"]


def test_errors_and_garbage_fail_the_watch() -> None:
    coll = Collection()
    forbidden = {"type": "ERROR", "object": {"kind": "Status", "status": "Failure", "reason": "Forbidden",
                                             "code": 403, "message": "pods is forbidden"}}
    with pytest.raises(WatchFailed, match="403 Forbidden"):
        coll.apply(forbidden)
    with pytest.raises(WatchFailed):
        coll.feed(b"<html>502</html>\n")
    with pytest.raises(WatchFailed):
        coll.apply({"type": "SOMETHING", "object": READY})
    with pytest.raises(Expired):  # a 410 status as a list's body
        coll.replace({"kind": "Status", "code": 410, "reason": "Expired", "items": None})


def test_the_inference_extensions_pool_and_objectives() -> None:
    pool = cluster.read_pool(yaml.safe_load((HERE / "gie-inferencepool.yaml").read_text()))
    assert pool == cluster.PoolSpec((("app", "primary-inference-model-server"),), (3000,))
    assert pool.label_selector() == "app=primary-inference-model-server"
    assert cluster.read_pool({"spec": {"selector": {"app": "x"}, "targetPortNumber": 8000}}).ports == (8000,)  # v1alpha2
    with pytest.raises(cluster.PoolError):
        cluster.read_pool({"spec": {"selector": {"matchLabels": {"app": "x"}}}})
    objectives = list(yaml.safe_load_all((HERE / "gie-inferenceobjectives.yaml").read_text()))
    assert cluster.objective_priorities(objectives, "vllm-qwen3-32b") == {
        "small-segment-lora": 1, "base-model": 2, "base-model-cpu": 2}
    assert cluster.objective_priorities(objectives, "another-pool") == {}
    unset = {"metadata": {"name": "batch"}, "spec": {"poolRef": {"name": "p"}}}
    assert cluster.objective_priorities([unset], "p") == {"batch": 0}  # unset: 0, as the reference reads it


def test_api_access_in_a_pod_from_a_kubeconfig_or_a_url(tmp_path: Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken\n")
    (sa / "namespace").write_text("inference")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    a = resolve_access(KubernetesSource(), env, sa)
    assert (a.server, a.namespace, a.ca_file) == ("https://10.96.0.1:443", "inference", str(sa / "ca.crt"))
    assert a.headers() == {"Authorization": "Bearer t0ken"}
    (sa / "token").write_text("rotated")
    assert a.headers() == {"Authorization": "Bearer rotated"}  # re-read: the kubelet rotates it
    with pytest.raises(AccessError, match="not in a pod"):
        resolve_access(KubernetesSource(), {}, sa)
    kc = tmp_path / "kubeconfig"
    kc.write_text(yaml.safe_dump({
        "current-context": "kind", "contexts": [{"name": "kind", "context": {"cluster": "c", "user": "u",
                                                                           "namespace": "ns1"}}],
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443/",
                                               "certificate-authority-data": base64.b64encode(b"PEM").decode()}}],
        "users": [{"name": "u", "user": {"token": "abc"}}]}))
    a = resolve_access(KubernetesSource(kubeconfig=str(kc)), {}, sa)
    assert (a.server, a.namespace, a.ca_data, a.headers()) == ("https://127.0.0.1:6443", "ns1", "PEM",
                                                               {"Authorization": "Bearer abc"})
    assert resolve_access(KubernetesSource(), {"KUBECONFIG": f"{kc}:/elsewhere"}, sa) == a  # outside a pod
    assert resolve_access(KubernetesSource(namespace="ns2"), {"KUBECONFIG": str(kc)}, sa).namespace == "ns2"
    a = resolve_access(KubernetesSource(api_server="http://127.0.0.1:9/", namespace="x"), env, sa)
    assert (a.server, a.namespace, a.headers(), a.ssl_context()) == ("http://127.0.0.1:9", "x", {}, False)
    assert api_path("v1", "x", "pods") == "/api/v1/namespaces/x/pods"
    assert api_path("inference.networking.k8s.io/v1", "x", "inferencepools") == \
        "/apis/inference.networking.k8s.io/v1/namespaces/x/inferencepools"
