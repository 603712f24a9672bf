"""deploy/kubernetes/endpoint-picker: it builds with kustomize, its core resources pass
kubernetes-validate (strict), and its InferencePool passes a structural schema of the CRD
(kubernetes-validate has no schema for a custom resource; it only warns). The pieces are wired to
each other and to the picker's own config; the image's `epp` role runs that config and reports healthy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.config.endpoint_picker import load_endpoint_picker
from tests.deploy.entrypoint import ENTRYPOINT, wait_healthy
from tests.deploy.tools import tool
from tests.kube_apiserver import KubeApiStandIn
from tests.stack_config import ROOT, free_port

EPP = ROOT / "deploy/kubernetes/endpoint-picker"
KUBERNETES_VERSION = "1.37.0"

# The InferencePool v1 CRD's constraints, transcribed (not copied) from
# kubernetes-sigs/gateway-api-inference-extension config/crd/bases/inference.networking.k8s.io_inferencepools.yaml
# at commit 84436a96b9e6ce2b59ddacd3d04c31b4fbd442de (2026-08-18): required fields, types, bounds,
# enums and the closed property sets of spec. The CEL rules are checked below by hand.
_PORT = {"type": "object", "required": ["number"], "additionalProperties": False,
         "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
INFERENCE_POOL_V1 = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["selector", "targetPorts"], "additionalProperties": False,
            "properties": {
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "selector": {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
                             "properties": {"matchLabels": {
                                 "type": "object", "minProperties": 1, "maxProperties": 64,
                                 "additionalProperties": {
                                     "type": "string", "maxLength": 63,
                                     "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}}}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": _PORT},
                "endpointPickerRef": {
                    "type": "object", "required": ["name"], "additionalProperties": False,
                    "properties": {
                        "group": {"type": "string", "maxLength": 253,
                                  "pattern": r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63,
                                 "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": _PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]}}}}}}}


def _build() -> list[dict[str, Any]]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(EPP)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [r for r in yaml.safe_load_all(out.stdout) if r]


def _res(resources: list[dict[str, Any]], kind: str, prefix: str = "") -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"].startswith(prefix))


def test_core_resources_pass_kubernetes_validate_and_the_pool_its_crd_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")  # kubernetes-validate's own dependency
    resources = _build()
    core = [r for r in resources if r["kind"] != "InferencePool"]
    manifest = tmp_path / "core.yaml"
    manifest.write_text(yaml.safe_dump_all(core))
    out = subprocess.run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", KUBERNETES_VERSION,
                          str(manifest)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (out.stdout + out.stderr).count(" passed for resource ") == len(core) == 7
    [pool] = [r for r in resources if r["kind"] == "InferencePool"]
    jsonschema.validate(pool, INFERENCE_POOL_V1)
    numbers = [p["number"] for p in pool["spec"]["targetPorts"]]
    assert len(set(numbers)) == len(numbers)  # CEL: port number must be unique
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref  # CEL: port required for a Service
    # The schema bites: a pool without a selector, or with a port out of range, fails.
    for broken in ({**pool, "spec": {k: v for k, v in pool["spec"].items() if k != "selector"}},
                   {**pool, "spec": {**pool["spec"], "targetPorts": [{"number": 70000}]}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, INFERENCE_POOL_V1)


def test_the_pool_the_picker_and_the_model_servers_are_wired_together() -> None:
    resources = _build()
    pool = _res(resources, "InferencePool")
    service = _res(resources, "Service", "modelyard-epp")
    deployment = _res(resources, "Deployment", "modelyard-epp")
    servers = _res(resources, "Deployment", "vllm-demo")
    config = _res(resources, "ConfigMap", "epp-config-")
    assert all(r["metadata"]["namespace"] == "modelyard" for r in resources)
    # The pool selects the model-server pods at their port, and names the picker's Service and port.
    labels = servers["spec"]["template"]["metadata"]["labels"]
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    server_ports = {p["containerPort"] for p in servers["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["number"] for p in pool["spec"]["targetPorts"]} <= server_ports
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == service["metadata"]["name"]
    svc_port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert svc_port["targetPort"] == "grpc" and svc_port["appProtocol"] == "kubernetes.io/h2c"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    # The picker's config is what the ConfigMap holds: its pool, its ports, its membership file.
    epp = load_endpoint_picker(EPP / "epp.yaml")
    assert config["data"]["epp.yaml"] == (EPP / "epp.yaml").read_text()
    assert epp.pool == pool["metadata"]["name"]
    assert int(epp.address.rpartition(":")[2]) == ports["grpc"]
    assert epp.metrics_address is not None and int(epp.metrics_address.rpartition(":")[2]) == ports["metrics"]
    assert container["args"] == ["epp"]
    assert container["readinessProbe"]["grpc"] == {"port": ports["grpc"], "service": "readiness"}
    assert container["livenessProbe"]["grpc"] == {"port": ports["grpc"], "service": "liveness"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config["metadata"]["name"]
    assert mounts["config"]["mountPath"] == "/etc/modelyard-epp"  # the entrypoint's default config path
    assert epp.endpoints_file is None and epp.endpoints == []  # the pods come from the API alone
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_pickers_service_account_may_read_the_pool_its_pods_and_objectives_and_nothing_more() -> None:
    resources = _build()
    pool = _res(resources, "InferencePool")
    deployment = _res(resources, "Deployment", "modelyard-epp")
    account = _res(resources, "ServiceAccount")
    role = _res(resources, "Role")
    binding = _res(resources, "RoleBinding")
    epp = load_endpoint_picker(EPP / "epp.yaml")
    assert epp.kubernetes is not None
    pod = deployment["spec"]["template"]["spec"]
    # The picker runs as the account, with its token mounted (the API access it resolves in a pod).
    assert pod["serviceAccountName"] == account["metadata"]["name"] and pod["automountServiceAccountToken"] is True
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "modelyard"}]
    # Read-only, on exactly what it lists and watches: the pool's API group and the objectives' own.
    grants = {(g, r): sorted(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"]}
    assert epp.kubernetes.pool_api == pool["apiVersion"]
    assert epp.kubernetes.objectives_api is not None
    assert grants == {("", "pods"): ["get", "list", "watch"],
                      (pool["apiVersion"].split("/")[0], "inferencepools"): ["get", "list", "watch"],
                      (epp.kubernetes.objectives_api.split("/")[0], "inferenceobjectives"): ["get", "list", "watch"]}
    # The model servers get no token: they never call the API.
    servers = _res(resources, "Deployment", "vllm-demo")
    assert servers["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_the_images_epp_role_serves_the_shipped_config_and_is_healthy(tmp_path: Path) -> None:
    port = free_port()
    # Outside a pod the picker takes $KUBECONFIG: here a stand-in API (tests/kube_apiserver.py) with the pool.
    pool = yaml.safe_load((EPP / "inferencepool.yaml").read_text())
    api = KubeApiStandIn("modelyard", pool["metadata"]["name"], pool["spec"]["selector"]["matchLabels"],
                         pool["spec"]["targetPorts"][0]["number"]).start()
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({
        "current-context": "stand-in", "contexts": [{"name": "stand-in", "context": {
            "cluster": "stand-in", "namespace": "modelyard"}}],
        "clusters": [{"name": "stand-in", "cluster": {"server": api.url}}]}))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "MODELYARD_ROLE_FILE": str(tmp_path / "role"), "MODELYARD_EPP_PORT": str(port),
           "MODELYARD_EPP_CONFIG": str(EPP / "epp.yaml"), "KUBECONFIG": str(tmp_path / "kubeconfig")}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    # The manifest's config; the addresses moved where this test may bind.
    proc = subprocess.Popen(["sh", str(ENTRYPOINT), "epp", "--address", f"127.0.0.1:{port}",
                             "--metrics-address", f"127.0.0.1:{free_port()}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "epp.log").open("wb"))
    # The picker's own log goes with any failure: a start that fails must say why, not only its signal.
    said = lambda: (tmp_path / "epp.log").read_text(errors="replace")[-3000:]  # noqa: E731
    try:
        def alive() -> None:
            assert proc.poll() is None, said()

        healthy = wait_healthy(env, tmp_path / "role", alive=alive)
        assert healthy is not None and healthy.returncode == 0, (healthy and healthy.stderr, said())
        assert (tmp_path / "role").read_text().strip() == "epp"
        assert api.lists("pods")  # ready only once the first pod list is in (extproc/epp/server.py)
        # The watches follow that list on their own: waited for, not raced (ready came first in a CI run).
        api.wait_for(lambda: api.watches("pods") and api.watches("inferenceobjectives"))
    finally:
        proc.terminate()
        code = proc.wait(timeout=15)
        api.stop()
    assert code == 0, said()
