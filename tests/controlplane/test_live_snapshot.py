"""The xDS snapshot is the static bootstrap's resources, reshaped only where xDS needs it:
`envoy render` and the live config cannot drift."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf import json_format

from contracts.config import load_config, parse_config
from contracts.errors import ConfigError
from controlplane.ads_bootstrap import XDS_CLUSTER, build_ads_bootstrap
from controlplane.bootstrap import build_bootstrap
from controlplane.environments import ENVIRONMENTS_DIR, load_environment
from controlplane.live.snapshot import CLUSTER, ENDPOINT, LISTENER, ROUTE, bridge, build_snapshot

ROOT = Path(__file__).resolve().parents[2]
ENVS = sorted(p.stem for p in ENVIRONMENTS_DIR.glob("*.yaml"))


def _inline(snap) -> tuple[dict[str, dict], dict[str, dict]]:
    """The snapshot with its RDS routes and EDS endpoints put back inline, as JSON dicts by name."""
    listeners = {}
    for name, lst in snap.of(LISTENER).items():
        msg = listener_pb2.Listener()
        msg.CopyFrom(lst)
        for chain in msg.filter_chains:
            for f in chain.filters:
                hcm = hcm_pb2.HttpConnectionManager()
                if f.typed_config.Unpack(hcm) and hcm.HasField("rds"):
                    hcm.route_config.CopyFrom(snap.of(ROUTE)[hcm.rds.route_config_name])
                    hcm.ClearField("rds")
                    f.typed_config.Pack(hcm)
        listeners[name] = json_format.MessageToDict(msg)
    clusters = {}
    for name, c in snap.of(CLUSTER).items():
        d = json_format.MessageToDict(c)
        if d.get("type") == "EDS":
            d["type"] = "STATIC"
            d.pop("edsClusterConfig")
            d["loadAssignment"] = json_format.MessageToDict(snap.of(ENDPOINT)[name])
        clusters[name] = d
    return listeners, clusters


@pytest.mark.parametrize("env_name", ENVS)
def test_snapshot_is_the_static_bootstrap(env_name: str) -> None:
    cfg, env = load_config(ROOT / "modelyard.yaml"), load_environment(env_name)
    static = bootstrap_pb2.Bootstrap.FromString(bytes(build_bootstrap(cfg, env))).static_resources
    listeners, clusters = _inline(build_snapshot(cfg, env, "v1"))
    assert listeners == {lst.name: json_format.MessageToDict(lst) for lst in static.listeners}
    # The ext_proc cluster stays in the bootstrap: Envoy needs it before any xDS arrives.
    assert clusters == {c.name: json_format.MessageToDict(c) for c in static.clusters if c.name != "modelyard-extproc"}


def test_routes_over_rds_and_ip_endpoints_over_eds() -> None:
    snap = build_snapshot(load_config(ROOT / "modelyard.yaml"), load_environment("dev"), "v1")
    assert set(snap.of(ROUTE)) == {"modelyard"}
    # Internal listeners' clusters and the aggregate keep their inline form; IP:port ones go to EDS.
    assert "demo-openai" in snap.of(ENDPOINT)
    assert not any(n.startswith("xlate~") or n.endswith("~failover") for n in snap.of(ENDPOINT))
    assert snap.required_types() == (CLUSTER, ENDPOINT, LISTENER, ROUTE)
    # Deterministic: the same config gives the same bytes, so Envoy sees no change where there is none.
    again = build_snapshot(load_config(ROOT / "modelyard.yaml"), load_environment("dev"), "v1")
    assert all(snap.encoded(t, n) == again.encoded(t, n) for t in (CLUSTER, LISTENER) for n in snap.of(t))


def test_dns_endpoints_stay_inline() -> None:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"][0]["deployments"][0]["endpoints"] = ["api.example.com:443"]
    snap = build_snapshot(parse_config(data), load_environment("dev"), "v1")
    name = data["models"][0]["deployments"][0]["cluster"]
    assert name not in snap.of(ENDPOINT)
    assert snap.of(CLUSTER)[name].type == snap.of(CLUSTER)[name].STRICT_DNS


def test_bridge_keeps_what_the_new_config_removes() -> None:
    env = load_environment("dev")
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    old = build_snapshot(parse_config(data), env, "old")
    # Every model served by demo-anthropic goes (demo-claude and the others the demo shares it with).
    data["models"] = [m for m in data["models"] if all(d["cluster"] != "demo-anthropic" for d in m["deployments"])]
    new = build_snapshot(parse_config(data), env, "new")
    assert "demo-anthropic" not in new.of(CLUSTER)
    step = bridge(new, old)
    assert not step.final and step.version == "new"
    assert "demo-anthropic" in step.of(CLUSTER) and "demo-anthropic" in step.of(ENDPOINT)
    assert set(step.of(CLUSTER)) == set(old.of(CLUSTER)) | set(new.of(CLUSTER))
    assert bridge(old, new) is old  # adding back removes nothing: no bridge needed
    assert bridge(new, new) is new


def test_ads_bootstrap_holds_only_what_must_be_static() -> None:
    cfg = load_config(ROOT / "modelyard.yaml")
    boot = json_format.MessageToDict(bootstrap_pb2.Bootstrap.FromString(bytes(build_ads_bootstrap(cfg, load_environment("prod")))))
    assert "listeners" not in boot["staticResources"]
    assert [c["name"] for c in boot["staticResources"]["clusters"]] == ["modelyard-extproc", XDS_CLUSTER]
    ads = boot["dynamicResources"]
    assert ads["adsConfig"]["grpcServices"][0]["envoyGrpc"]["clusterName"] == XDS_CLUSTER
    assert "ads" in ads["cdsConfig"] and "ads" in ads["ldsConfig"]
    assert boot["node"]["id"] and boot["node"]["cluster"]


def test_ads_bootstrap_refuses_what_the_static_one_refuses() -> None:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"][1]["deployments"][0]["queue"]["max_wait_s"] = {"L1": 600, "L2": 20, "L3": 15}
    with pytest.raises(ConfigError, match="edge.request_timeout_s"):
        build_ads_bootstrap(parse_config(data), load_environment("dev"))


def test_envoy_render_writes_the_ads_bootstrap_when_the_config_enables_the_control_plane(tmp_path: Path) -> None:
    from modelyard import cli

    shipped = load_config(ROOT / "modelyard.yaml")
    assert shipped.controlplane.enabled  # `make up` runs live configuration
    out = tmp_path / "envoy.yaml"
    assert cli.main(["envoy", "render", "--env", "dev", "--config", str(ROOT / "modelyard.yaml"), "-o", str(out)]) == 0
    boot = yaml.safe_load(out.read_text())
    assert "dynamic_resources" in boot and "listeners" not in boot["static_resources"]
    assert cli.main(["envoy", "render", "--env", "dev", "--static", "--config", str(ROOT / "modelyard.yaml"),
                     "-o", str(out)]) == 0
    boot = yaml.safe_load(out.read_text())
    assert "dynamic_resources" not in boot and boot["static_resources"]["listeners"]
