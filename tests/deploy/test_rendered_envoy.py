"""The Envoy configs that docker-compose.yml and the Kubernetes ConfigMap mount are exactly what
`modelyard envoy render` produces today, and a real Envoy accepts them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from devstack.launcher import envoy_binary
from modelyard import cli
from tests.stack_config import ROOT

RENDERED = {
    "compose": (ROOT / "deploy/compose/modelyard.yaml", ROOT / "deploy/compose/envoy.yaml"),
    "kubernetes": (ROOT / "deploy/kubernetes/base/modelyard.yaml", ROOT / "deploy/kubernetes/base/envoy.yaml"),
}


def _render(env: str, config: Path, out: Path) -> str:
    # The CLI in-process: a subprocess would spend seconds importing what this one already has.
    assert cli.main(["envoy", "render", "--env", env, "--config", str(config), "-o", str(out)]) == 0
    return out.read_text()


@pytest.mark.parametrize("env", sorted(RENDERED))
def test_checked_in_envoy_config_is_the_rendered_one(env: str, tmp_path: Path) -> None:
    config, checked_in = RENDERED[env]
    # Parsed, not as text: the access log's JSON format is a protobuf map, whose key order varies.
    assert yaml.safe_load(_render(env, config, tmp_path / "envoy.yaml")) == yaml.safe_load(checked_in.read_text()), (
        f"{checked_in} is stale: modelyard envoy render --env {env} --config {config.relative_to(ROOT)} "
        f"-o {checked_in.relative_to(ROOT)}")


@pytest.mark.parametrize("env", sorted(RENDERED))
def test_envoy_validates_the_rendered_config(env: str) -> None:
    _, checked_in = RENDERED[env]
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(checked_in)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "OK" in out.stdout + out.stderr


@pytest.mark.parametrize("env", sorted(RENDERED))
def test_static_render_still_works_and_envoy_accepts_it(env: str, tmp_path: Path) -> None:
    # --static inlines what the control plane would serve: a gateway without one still has a bootstrap.
    config, _ = RENDERED[env]
    out = tmp_path / "envoy.yaml"
    assert cli.main(["envoy", "render", "--static", "--env", env, "--config", str(config), "-o", str(out)]) == 0
    boot = yaml.safe_load(out.read_text())
    assert "dynamic_resources" not in boot and boot["static_resources"]["listeners"]
    checked = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                             timeout=120)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


def test_compose_envoy_listens_where_compose_publishes(tmp_path: Path) -> None:
    # The listeners come over ADS; the control plane serves those of the static render.
    config, checked_in = RENDERED["compose"]
    out = tmp_path / "static.yaml"
    assert cli.main(["envoy", "render", "--static", "--env", "compose", "--config", str(config), "-o", str(out)]) == 0
    static = yaml.safe_load(out.read_text())
    ports = {ln["name"]: ln["address"]["socket_address"] for ln in static["static_resources"]["listeners"]
             if "address" in ln}
    assert ports["modelyard"] == {"address": "0.0.0.0", "port_value": 10000}
    assert ports["stats"] == {"address": "0.0.0.0", "port_value": 9902}
    boot = yaml.safe_load(checked_in.read_text())
    # Admin stays on the container's loopback; only the stats listener faces the network.
    assert boot["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    extproc = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "modelyard-extproc")
    hosts = [e["endpoint"]["address"]["socket_address"]["address"]
             for e in extproc["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["extproc-1", "extproc-2"] and extproc["type"] == "STRICT_DNS"
