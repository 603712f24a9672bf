"""The endpoint picker's cluster watch (extproc/epp/kubeapi.py) as it runs in a pod: HTTPS to
$KUBERNETES_SERVICE_HOST:PORT verified against the service account's CA, its token as the bearer
(re-read on every request), its namespace; the API is the stand-in of tests/kube_apiserver.py,
serving recorded responses over TLS and refusing a wrong token with 401; a watch refused with
HTTP 410 lists again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from contracts.config.endpoint_picker import KubernetesSource
from extproc.epp.kubeapi import ClusterSource, resolve_access
from tests.kube_apiserver import PODS, KubeApiStandIn
from tests.tls_certs import TestCA


async def _until(predicate: object, limit_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not predicate():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


async def test_in_a_pod_over_tls_with_the_service_accounts_token_rotated(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    leaf = ca.leaf("apiserver", ["IP:127.0.0.1"])
    api = KubeApiStandIn("inference", "pool-a", {"app": "vllm"}, 8000, tls=(leaf.cert, leaf.key),
                         token="token-2").start()
    api.put_pod("vllm-0", "10.0.0.7")
    api.put_pod("vllm-1", "10.0.0.8", ready=False)
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "ca.crt").write_bytes(ca.cert.read_bytes())
    (sa / "namespace").write_text("inference")
    (sa / "token").write_text("token-1")  # about to be rotated: the API wants token-2
    access = resolve_access(KubernetesSource(), {"KUBERNETES_SERVICE_HOST": "127.0.0.1",
                                                 "KUBERNETES_SERVICE_PORT": str(api.port)}, sa)
    assert access.server == f"https://127.0.0.1:{api.port}"
    members: list[list[str]] = []
    priorities: list[dict[str, int]] = []
    source = ClusterSource(KubernetesSource(backoff_max_s=0.2), "pool-a", members.append, priorities.append,
                           access=access)
    await source.start()
    try:
        await _until(lambda: len([r for r in api.requests if r[0] == "unauthorized"]) >= 2)
        assert members == []  # refused: nothing learned, and it keeps trying
        (sa / "token").write_text("token-2\n")  # the kubelet rotates the projected token
        await _until(lambda: members)
        assert members == [["10.0.0.7:8000"]]
        api.put_pod("vllm-1", "10.0.0.8")
        await _until(lambda: members[-1] == ["10.0.0.7:8000", "10.0.0.8:8000"])
        api.put_objective("batch", -1)
        api.put_objective("elsewhere", 5, pool="pool-b")
        await _until(lambda: priorities and priorities[-1] == {"batch": -1})
        assert api.lists(PODS) == 1
        # A watch refused with HTTP 410 (not 200 and the ERROR frame): listed again all the same.
        watches = len(api.watches(PODS))
        api.hold_watches()
        api.close_watches()
        await _until(lambda: len(api.watches(PODS)) > watches)
        api.delete_pod("vllm-0")
        api.expire()
        api.gone_as_status = True
        api.release_watches()
        await _until(lambda: members[-1] == ["10.0.0.8:8000"])
        assert api.lists(PODS) == 2
    finally:
        await source.stop()
        api.stop()
