"""docker-compose.yml: Docker Compose itself accepts it (`config`, no daemon needed), and every
name the configs use (Envoy's clusters, the gateway's endpoints, Prometheus' targets, Grafana's
datasource) is a service it runs, on the port that service listens on."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from modelyard import cli
from tests.deploy.tools import tool
from tests.stack_config import ROOT


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    env = {**os.environ, "GRAFANA_ADMIN_PASSWORD": "test-only", "MODELYARD_TASK_SECRET": "test-only"}
    out = subprocess.run([tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "config", "--format",
                          "json"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compose_refuses_to_start_grafana_without_an_admin_password() -> None:
    env = {**{k: v for k, v in os.environ.items() if k != "GRAFANA_ADMIN_PASSWORD"}, "MODELYARD_TASK_SECRET": "t"}
    out = subprocess.run([tool("docker-compose"), "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert out.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in out.stderr


def _command(svc: dict[str, Any]) -> list[str]:
    return svc.get("command") or []


def _mounts(svc: dict[str, Any]) -> dict[str, Path]:
    return {v["target"]: Path(v["source"]) for v in svc.get("volumes", []) if v["type"] == "bind"}


def test_services_and_roles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"envoy", "extproc-1", "extproc-2", "redis", "gpu-agent", "prometheus", "grafana"} <= set(services)
    roles = {name: _command(svc)[0] for name, svc in services.items() if svc.get("image") == "modelyard:latest"}
    assert roles["envoy"] == "envoy" and roles["extproc-1"] == roles["extproc-2"] == "extproc"
    assert roles["controlplane"] == "controlplane" and "--watch" in _command(services["controlplane"])
    assert roles["gpu-agent"] == "agent" and "--fake" in _command(services["gpu-agent"])
    assert {n for n, r in roles.items() if r == "demo"} >= {"demo-openai", "demo-anthropic", "demo-kserve"}
    for name in roles:
        assert services[name]["build"]["context"] == str(ROOT), name
        assert services[name]["read_only"] is True, name
    # Every bind mount's source is a file or folder of this repository.
    for svc in services.values():
        for source in _mounts(svc).values():
            assert source.exists(), source


def test_envoy_mounts_the_rendered_config_and_reaches_every_service(compose: dict[str, Any], tmp_path: Path) -> None:
    services = compose["services"]
    mounted = _mounts(services["envoy"])["/etc/modelyard/envoy.yaml"]
    assert mounted == ROOT / "deploy/compose/envoy.yaml"  # tests/deploy/test_rendered_envoy.py renders it
    assert services["envoy"]["ports"][0]["target"] == 10000
    boot = yaml.safe_load(mounted.read_text())
    # Envoy's listeners and clusters come over ADS; check the hosts of everything it will run.
    static = tmp_path / "static.yaml"
    assert cli.main(["envoy", "render", "--static", "--env", "compose", "--config",
                     str(ROOT / "deploy/compose/modelyard.yaml"), "-o", str(static)]) == 0
    hosts = {
        ep["endpoint"]["address"]["socket_address"]["address"]
        for b in (boot, yaml.safe_load(static.read_text()))
        for c in b["static_resources"]["clusters"] if "load_assignment" in c
        for group in c["load_assignment"]["endpoints"] for ep in group["lb_endpoints"]
        if "socket_address" in ep["endpoint"]["address"]
    }
    assert hosts - {"127.0.0.1"} <= set(services), hosts - set(services)
    # Both extproc replicas read the compose gateway config, which points at compose services only.
    gateway_config = _mounts(services["extproc-1"])["/etc/modelyard/modelyard.yaml"]
    assert gateway_config == _mounts(services["extproc-2"])["/etc/modelyard/modelyard.yaml"]
    cfg = yaml.safe_load(gateway_config.read_text())
    endpoints = {ep.rpartition(":")[0] for m in cfg["models"] for d in m["deployments"] for ep in d["endpoints"]}
    watermarks = {urlparse(d["watermark"]["url"]).hostname for m in cfg["models"] for d in m["deployments"]
                  if d.get("watermark")}
    assert endpoints | watermarks | {urlparse(cfg["ratelimit"]["redis"]["url"]).hostname} <= set(services)
    # Each demo upstream listens on the port the gateway config names for it.
    for m in cfg["models"]:
        for d in m["deployments"]:
            for ep in d["endpoints"]:
                host, _, port = ep.rpartition(":")
                cmd = _command(services[host])
                assert cmd[cmd.index("--port") + 1] == port, (host, cmd)


def test_prometheus_scrapes_compose_services_and_grafana_reads_it(compose: dict[str, Any]) -> None:
    services = compose["services"]
    prom_dir = _mounts(services["prometheus"])["/etc/prometheus"]
    assert prom_dir == ROOT / "deploy/prometheus"
    prom = yaml.safe_load((prom_dir / "prometheus.yml").read_text())
    for job in prom["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            assert target.rpartition(":")[0] in services, (job["job_name"], target)
    assert {t for j in prom["scrape_configs"] for t in j["static_configs"][0]["targets"]} == {
        "envoy:9902", "extproc-1:9464", "extproc-2:9464", "gpu-agent:8301"}
    for rule_file in prom["rule_files"]:
        assert (prom_dir / rule_file).exists()
    provisioning = _mounts(services["grafana"])["/etc/grafana/provisioning"]
    datasource = yaml.safe_load((provisioning / "datasources/prometheus.yml").read_text())["datasources"][0]
    assert urlparse(datasource["url"]).hostname == "prometheus" and datasource["uid"] == "prometheus"
    dashboards = yaml.safe_load((provisioning / "dashboards/modelyard.yml").read_text())["providers"][0]
    dash_dir = _mounts(services["grafana"])[dashboards["options"]["path"]]
    dash = json.loads((dash_dir / "modelyard.json").read_text())
    assert dash["uid"] == "modelyard" and dash["templating"]["list"][0]["current"]["value"] == datasource["uid"]


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def test_control_plane_watches_the_gateway_config_and_envoy_and_extprocs_dial_it(compose: dict[str, Any]) -> None:
    services = compose["services"]
    cp = services["controlplane"]
    assert _command(cp)[_command(cp).index("--env") + 1] == "compose"
    # It watches the very file the extprocs start on, through a folder mount (an editor's rename-save
    # leaves a file bind mount on the old file).
    folder = _mounts(cp)["/etc/modelyard"]
    assert folder.is_dir()
    config_file = _mounts(services["extproc-1"])["/etc/modelyard/modelyard.yaml"]
    assert folder / "modelyard.yaml" == config_file
    cfg = yaml.safe_load(config_file.read_text())["controlplane"]
    assert cfg["enabled"] is True
    assert cfg["xds_address"] == f"controlplane:{_port(cfg['xds_address'])}"
    assert cfg["api_address"] == f"controlplane:{_port(cfg['api_address'])}"
    # The image's healthcheck probes the API port the config names.
    assert cp["environment"]["MODELYARD_CONTROLPLANE_API_PORT"] == str(_port(cfg["api_address"]))
    # Envoy's bootstrap takes ADS from it, and Envoy and the extprocs start once it is healthy.
    boot = yaml.safe_load(_mounts(services["envoy"])["/etc/modelyard/envoy.yaml"].read_text())
    xds_name = boot["dynamic_resources"]["ads_config"]["grpc_services"][0]["envoy_grpc"]["cluster_name"]
    xds = next(c for c in boot["static_resources"]["clusters"] if c["name"] == xds_name)
    assert xds["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] == {
        "address": "controlplane", "port_value": _port(cfg["xds_address"])}
    for name in ("envoy", "extproc-1", "extproc-2"):
        assert services[name]["depends_on"]["controlplane"]["condition"] == "service_healthy", name
