"""deploy/kubernetes: every overlay builds with kustomize (kubectl's), every resource it yields
passes kubernetes-validate (strict) for a current Kubernetes, and the pieces the design needs are
there and wired to each other."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.config import parse_config
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import load_environment
from tests.deploy.tools import KUBERNETES_VERSION, tool
from tests.stack_config import ROOT

K8S = ROOT / "deploy/kubernetes"
OVERLAYS = ["base", "overlays/staging", "overlays/prod"]


def _build(overlay: str) -> str:
    out = subprocess.run([tool("kubectl"), "kustomize", str(K8S / overlay)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _resources(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(_build(overlay)) if r}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_resource_passes_kubernetes_validate(overlay: str, tmp_path: Path) -> None:
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(_build(overlay))
    out = subprocess.run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", KUBERNETES_VERSION,
                          str(manifest)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    passed = out.stdout.count(" passed for resource ") + out.stderr.count(" passed for resource ")
    assert passed == len(_resources(overlay)) >= 13


def _kind(res: dict[tuple[str, str], dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    return next(r for (k, n), r in res.items() if k == kind and n.startswith(prefix))


def test_base_wires_probes_scaling_config_and_gpu_nodes() -> None:
    res = _resources("base")
    extproc = res[("Deployment", "extproc")]["spec"]["template"]["spec"]
    container = extproc["containers"][0]
    assert container["readinessProbe"]["grpc"] == {"port": 50051}
    assert container["livenessProbe"]["grpc"] == {"port": 50051}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    hpa = res[("HorizontalPodAutoscaler", "extproc")]["spec"]
    assert {m["type"] for m in hpa["metrics"]} == {"Resource", "Pods"}
    assert hpa["scaleTargetRef"]["name"] == "extproc"
    assert {("PodDisruptionBudget", "extproc"), ("PodDisruptionBudget", "envoy"), ("Deployment", "redis"),
            ("Service", "redis"), ("Service", "envoy")} <= set(res)
    agent = res[("DaemonSet", "gpu-agent")]["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert any(t["key"] == "nvidia.com/gpu" for t in agent["tolerations"])
    assert agent["containers"][0]["ports"][0]["hostPort"] == 8301
    # Only Envoy reaches the extproc's gRPC port, only the extproc reaches Redis.
    policy = res[("NetworkPolicy", "extproc")]["spec"]["ingress"][0]
    assert policy["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "envoy"}
    assert res[("NetworkPolicy", "redis")]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "extproc"}
    # The headless Service Envoy resolves: one address per ready extproc pod.
    assert res[("Service", "extproc")]["spec"]["clusterIP"] == "None"

    # The ConfigMaps hold the files kustomize generated them from, and the pods mount those ConfigMaps.
    config = res[("ConfigMap", "modelyard-config")]  # no name hash: the control plane applies changes live
    envoy_config = _kind(res, "ConfigMap", "envoy-config-")
    assert config["data"]["modelyard.yaml"] == (K8S / "base/modelyard.yaml").read_text()
    assert envoy_config["data"]["envoy.yaml"] == (K8S / "base/envoy.yaml").read_text()
    assert extproc["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]
    envoy = res[("Deployment", "envoy")]["spec"]["template"]["spec"]
    assert envoy["volumes"][0]["configMap"]["name"] == envoy_config["metadata"]["name"]
    cfg = parse_config(yaml.safe_load(config["data"]["modelyard.yaml"]))
    assert cfg.extproc.address == "0.0.0.0:50051" and cfg.ratelimit.backend == "redis"
    # Envoy's ext_proc cluster (static in the ADS bootstrap too) is the headless Service.
    boot = yaml.safe_load(envoy_config["data"]["envoy.yaml"])
    extproc_cluster = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "modelyard-extproc")
    address = extproc_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]
    assert address["socket_address"] == {"address": "extproc", "port_value": 50051}
    # The listeners come over ADS: the control plane serves those of the static render
    # (tests/controlplane/test_live_snapshot.py); their ports match the containers'.
    static = yaml.safe_load(render_bootstrap(cfg, load_environment("kubernetes")))
    ports = {p["name"]: p["containerPort"] for p in envoy["containers"][0]["ports"]}
    listeners = {ln["name"]: ln["address"]["socket_address"]["port_value"]
                 for ln in static["static_resources"]["listeners"] if "address" in ln}
    assert ports == {"http": listeners["modelyard"], "stats": listeners["stats"]}


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_control_plane_runs_watches_the_configmap_and_is_what_envoy_and_the_extprocs_dial() -> None:
    res = _resources("base")
    config = res[("ConfigMap", "modelyard-config")]
    cfg = parse_config(yaml.safe_load(config["data"]["modelyard.yaml"]))
    assert cfg.controlplane.enabled
    deployment = res[("Deployment", "controlplane")]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["args"][:2] == ["controlplane", "--watch"]
    assert container["args"][container["args"].index("--env") + 1] == "kubernetes"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    # The ConfigMap is mounted as a directory: a subPath mount never sees the kubelet's updates.
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == "modelyard-config")
    mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
    assert "subPath" not in mount and "subPathExpr" not in mount
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["MODELYARD_CONFIG"] == f"{mount['mountPath']}/modelyard.yaml"
    # Every pod that reads the file mounts it the same way (the extprocs start on the same text).
    for name in ("extproc", "controlplane"):
        spec = res[("Deployment", name)]["spec"]["template"]["spec"]
        for c in spec["containers"]:
            assert all("subPath" not in m for m in c["volumeMounts"]), name
    # The ports the config names are the container's, the Service's, and what the probes ask.
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"xds": _port(cfg.controlplane.xds_address), "api": _port(cfg.controlplane.api_address)}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v1/status", "port": "api"}
    assert container["livenessProbe"]["tcpSocket"] == {"port": "xds"}
    service = res[("Service", "controlplane")]
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    svc_ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert svc_ports == {"xds": (ports["xds"], "xds"), "api": (ports["api"], "api")}
    # The extprocs long-poll the Service; Envoy's bootstrap takes ADS from it.
    name = service["metadata"]["name"]
    assert cfg.controlplane.api_address == f"{name}:{ports['api']}"
    assert cfg.controlplane.xds_address == f"{name}:{ports['xds']}"
    boot = yaml.safe_load(_kind(res, "ConfigMap", "envoy-config-")["data"]["envoy.yaml"])
    assert "listeners" not in boot["static_resources"]
    ads = boot["dynamic_resources"]["ads_config"]
    xds_name = ads["grpc_services"][0]["envoy_grpc"]["cluster_name"]
    xds = next(c for c in boot["static_resources"]["clusters"] if c["name"] == xds_name)
    assert xds["type"] == "STRICT_DNS"
    assert xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": name, "port_value": ports["xds"]}
    assert boot["dynamic_resources"]["lds_config"] == boot["dynamic_resources"]["cds_config"] == {
        "ads": {}, "resource_api_version": "V3"}
    # Only Envoy reaches ADS, only the extprocs the long poll.
    policy = res[("NetworkPolicy", "controlplane")]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "controlplane"}
    admitted = {(rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/name"], rule["ports"][0]["port"])
                for rule in policy["ingress"]}
    assert admitted == {("envoy", ports["xds"]), ("extproc", ports["api"])}


def test_overlays_keep_the_configmap_name_the_control_plane_mounts() -> None:
    for overlay in OVERLAYS:
        res = _resources(overlay)
        assert ("ConfigMap", "modelyard-config") in res, overlay
        pod = res[("Deployment", "controlplane")]["spec"]["template"]["spec"]
        assert {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v} == {"modelyard-config"}


def test_overlays_change_what_they_say() -> None:
    staging, prod = _resources("overlays/staging"), _resources("overlays/prod")
    assert ("Namespace", "modelyard-staging") in staging
    assert {r["metadata"].get("namespace") for k, r in staging.items() if k[0] != "Namespace"} == {"modelyard-staging"}
    assert staging[("HorizontalPodAutoscaler", "extproc")]["spec"]["maxReplicas"] == 4
    assert prod[("Service", "envoy")]["spec"]["type"] == "LoadBalancer"
    assert prod[("HorizontalPodAutoscaler", "extproc")]["spec"]["minReplicas"] == 3
    assert all(r["spec"]["minAvailable"] == 2 for (k, _), r in prod.items() if k == "PodDisruptionBudget")
    image = prod[("Deployment", "extproc")]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/modelyard:0.1.0"
