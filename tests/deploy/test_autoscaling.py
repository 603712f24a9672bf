"""deploy/kubernetes/autoscaling: the KEDA ScaledObject and the HPA that scale a model server on the
gateway's demand signals. Each tree builds with kustomize; the built-in kinds pass kubernetes-validate
(strict), the ScaledObject a schema of KEDA's CRD kept in tests/deploy/schemas (where it came from is in
the file); every query is PromQL promtool accepts and names only series the extproc exports."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from prometheus_client import REGISTRY

import extproc.telemetry.demand  # noqa: F401  (registers the series)
import extproc.telemetry.metrics  # noqa: F401
from contracts.config import load_config
from tests.deploy.tools import KUBERNETES_VERSION, tool
from tests.stack_config import ROOT

TREES = ROOT / "deploy/kubernetes/autoscaling"
KEDA_SCHEMA = Path(__file__).parent / "schemas/keda-scaledobject-v1alpha1.json"


def _build(tree: str) -> list[dict[str, Any]]:
    out = subprocess.run([tool("kubectl"), "kustomize", str(TREES / tree)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return [r for r in yaml.safe_load_all(out.stdout) if r]


def _exported() -> set[str]:
    """Every series name the extproc can export (a counter's _total, a histogram's _bucket/_sum/_count)."""
    names = set()
    for family in REGISTRY.collect():
        names.add(family.name)
        names |= {family.name + s for s in ("_total", "_bucket", "_sum", "_count")}
    return names


def _series(query: str) -> set[str]:
    return set(re.findall(r"\b(modelyard_[a-z_]+)\b", query))


def _promtool_accepts(exprs: list[str], tmp_path: Path) -> None:
    rules = {"groups": [{"name": "autoscaling", "rules": [
        {"record": f"modelyard:autoscaling_{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "queries.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("tree", ["keda", "hpa"])
def test_built_in_kinds_pass_kubernetes_validate(tree: str, tmp_path: Path) -> None:
    built = [r for r in _build(tree) if r["kind"] != "ScaledObject"]
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(yaml.safe_dump_all(built))
    out = subprocess.run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", KUBERNETES_VERSION,
                          str(manifest)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    passed = out.stdout.count(" passed for resource ") + out.stderr.count(" passed for resource ")
    assert passed == len(built) >= 2  # the model server (+ the HPA and the adapter rules)


def test_scaled_object_matches_kedas_schema_and_scales_the_model_server(tmp_path: Path) -> None:
    built = _build("keda")
    so = next(r for r in built if r["kind"] == "ScaledObject")
    jsonschema.validate(so, json.loads(KEDA_SCHEMA.read_text()))
    target = so["spec"]["scaleTargetRef"]
    assert any(r["kind"] == target["kind"] == "Deployment" and r["metadata"]["name"] == target["name"] for r in built)
    queries = [t["metadata"]["query"] for t in so["spec"]["triggers"]]
    assert all(t["type"] == "prometheus" for t in so["spec"]["triggers"])
    assert set().union(*map(_series, queries)) <= _exported()
    assert {"modelyard_inflight", "modelyard_queue_depth"} <= set().union(*map(_series, queries))
    _promtool_accepts(queries, tmp_path)
    # A typo in a field is refused, not pruned away in silence.
    bad = {**so, "spec": {**so["spec"], "minReplicas": 0}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, json.loads(KEDA_SCHEMA.read_text()))


def test_hpa_reads_the_external_metrics_the_adapter_rules_serve(tmp_path: Path) -> None:
    built = _build("hpa")
    hpa = next(r for r in built if r["kind"] == "HorizontalPodAutoscaler")
    config = next(r for r in built if r["kind"] == "ConfigMap")
    rules = yaml.safe_load(config["data"]["config.yaml"])["externalRules"]
    served = {r["name"]["as"] for r in rules}
    wanted = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert wanted <= served and "modelyard_deployment_idle_seconds" in served
    # Each rule's series and query name exported series; the query, templated as the adapter does, is PromQL.
    for r in rules:
        assert _series(r["seriesQuery"]) <= _exported()
        assert _series(r["metricsQuery"]) <= _exported()
        assert re.fullmatch(r["name"]["matches"], _series(r["seriesQuery"]).pop())
    _promtool_accepts([r["metricsQuery"].replace("<<.LabelMatchers>>", 'cluster="demo-openai-mini"')
                       for r in rules], tmp_path)
    # The selected deployment is one the shipped config limits (its queue makes the demand signals).
    clusters = {m["external"]["metric"]["selector"]["matchLabels"]["cluster"] for m in hpa["spec"]["metrics"]}
    shipped = load_config(ROOT / "modelyard.yaml").clusters()
    assert all(shipped[c].max_inflight for c in clusters)
    assert hpa["spec"]["scaleTargetRef"]["name"] in {r["metadata"]["name"] for r in built if r["kind"] == "Deployment"}


def test_demand_series_are_named_as_the_docs_say() -> None:
    doc = (ROOT / "docs/deploy.md").read_text()
    for name in ("modelyard_deployment_max_inflight", "modelyard_deployment_utilization",
                 "modelyard_deployment_idle_seconds", "modelyard_deployment_last_request_timestamp_seconds",
                 "modelyard_inflight", "modelyard_queue_depth", "modelyard_queue_wait_seconds",
                 "modelyard_queue_refused_total", "modelyard_spilled_total"):
        assert name in _exported() and name in doc, name


def test_scale_from_zero_component_grants_exactly_the_scale_subresource(tmp_path: Path) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(ROOT / "deploy/kubernetes/base", overlay)],
        "components": [os.path.relpath(TREES / "scale-from-zero", overlay)]}))
    out = subprocess.run([tool("kubectl"), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = {(r["kind"], r["metadata"]["name"]): r for r in yaml.safe_load_all(out.stdout) if r}
    role = built[("Role", "modelyard-scaler")]
    assert role["metadata"]["namespace"] == "modelyard"
    assert role["rules"] == [{"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]}]
    binding = built[("RoleBinding", "modelyard-scaler")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "modelyard-scaler", "namespace": "modelyard"}]
    pod = built[("Deployment", "extproc")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "modelyard-scaler" and pod["automountServiceAccountToken"] is True
    assert not any(r["kind"] == "ClusterRole" for r in built.values())
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(out.stdout)
    check = subprocess.run([tool("kubernetes-validate"), "--strict", "--kubernetes-version", KUBERNETES_VERSION,
                            str(manifest)], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
