"""`lb:` and `health_check:` render into each deployment's cluster and the route, Envoy accepts
every policy, and a bad setting is refused at load time naming the key."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.config import parse_config
from contracts.errors import ConfigError
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import load_environment
from devstack.launcher import envoy_binary
from tests.stack_config import small_config


def _config(**deployment: Any) -> dict[str, Any]:
    data = small_config()
    dep = data["models"][0]["deployments"][0]
    dep["endpoints"] = ["127.0.0.1:8101", "127.0.0.1:8111", "model-b.internal:8000"]
    dep.update(deployment)
    if dep["protocol"].startswith("kserve"):
        data["models"][0]["task_types"] = ["infer"]  # a KServe deployment serves inference (config check)
    return data


def _rendered(data: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(render_bootstrap(parse_config(data), load_environment("staging")))


def _cluster(boot: dict[str, Any], name: str = "demo-openai") -> dict[str, Any]:
    return next(c for c in boot["static_resources"]["clusters"] if c["name"] == name)


def _route_action(boot: dict[str, Any]) -> dict[str, Any]:
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]


def test_defaults_are_unweighted_round_robin_without_checks() -> None:
    data = _config()
    data["models"][0]["deployments"][0].pop("health_check", None)
    boot = _rendered(data)
    c = _cluster(boot)
    assert c.get("lb_policy", "ROUND_ROBIN") == "ROUND_ROBIN"
    assert "health_checks" not in c
    assert all("load_balancing_weight" not in e for e in c["load_assignment"]["endpoints"][0]["lb_endpoints"])
    assert "hash_policy" not in _route_action(boot)


def test_weights_name_endpoints_and_the_rest_weigh_one() -> None:
    c = _cluster(_rendered(_config(lb={"weights": {"127.0.0.1:8111": 5}})))
    assert [e.get("load_balancing_weight") for e in c["load_assignment"]["endpoints"][0]["lb_endpoints"]] == [1, 5, 1]


def test_least_request_and_ring_hash() -> None:
    assert _cluster(_rendered(_config(lb={"policy": "least_request"})))["lb_policy"] == "LEAST_REQUEST"
    boot = _rendered(_config(lb={"policy": "ring_hash", "hash_header": "x-session-id"}))
    assert _cluster(boot)["lb_policy"] == "RING_HASH"
    assert _route_action(boot)["hash_policy"] == [{"header": {"header_name": "x-session-id"}}]


def test_http_and_grpc_health_checks() -> None:
    hc = _cluster(_rendered(_config(health_check={"http_path": "/healthz", "interval_s": 2,
                                                  "unhealthy_threshold": 3})))["health_checks"][0]
    assert hc["http_health_check"] == {"path": "/healthz"}
    assert (hc["interval"], hc["no_traffic_interval"], hc["unhealthy_threshold"]) == ("2s", "2s", 3)
    hc = _cluster(_rendered(_config(protocol="kserve-grpc", health_check={"grpc_service": "inference"})))[
        "health_checks"][0]
    assert hc["grpc_health_check"] == {"service_name": "inference"}


@pytest.mark.parametrize("deployment", [
    {"lb": {"policy": "ring_hash", "hash_header": "x-user"}, "health_check": {"http_path": "/health"}},
    {"lb": {"policy": "least_request", "weights": {"127.0.0.1:8101": 3}}, "health_check": {"grpc_service": ""},
     "protocol": "kserve-grpc"},
    {"lb": {"policy": "random"}},
], ids=["ring_hash+http-check", "least_request+weights+grpc-check", "random"])
def test_envoy_accepts_every_policy(deployment: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "envoy.yaml"
    out.write_text(render_bootstrap(parse_config(_config(**deployment)), load_environment("prod")))
    v = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr


@pytest.mark.parametrize(("deployment", "message"), [
    ({"lb": {"policy": "ring_hash"}}, "ring_hash needs hash_header"),
    ({"lb": {"hash_header": "x-user"}}, "ring_hash needs hash_header"),
    ({"lb": {"weights": {"10.0.0.9:80": 2}}}, "10.0.0.9:80, not in endpoints"),
    ({"lb": {"weights": {"127.0.0.1:8101": 0}}}, "must be 1..128"),
    ({"lb": {"policy": "random", "weights": {"127.0.0.1:8101": 2}}}, "random ignores weights"),
    ({"lb": {"policy": "fastest"}}, "lb.policy"),
    ({"health_check": {"http_path": "/h", "grpc_service": ""}}, "exactly one of http_path"),
    ({"health_check": {}}, "exactly one of http_path"),
    ({"health_check": {"http_path": "health"}}, "health_check.http_path"),
    ({"health_check": {"grpc_service": ""}}, "checked with grpc_service"),
    ({"protocol": "kserve-grpc", "health_check": {"http_path": "/v2/health/ready"}}, "checked with grpc_service"),
], ids=[
    "ring_hash-no-header", "header-without-ring_hash", "weight-unknown-endpoint", "weight-0",
    "random-with-weights", "unknown-policy", "two-health-checks", "empty-health-check", "relative-http-path",
    "grpc-check-on-http", "http-check-on-kserve-grpc"
])
def test_bad_settings_name_the_key(deployment: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_config(**deployment))


def test_replica_metrics_renders_override_host_with_the_policy_as_fallback(tmp_path: Path) -> None:
    data = _config(lb={"policy": "least_request"}, replica_metrics={"kind": "vllm"})
    data["models"][0]["deployments"][0]["endpoints"] = ["127.0.0.1:8101", "127.0.0.1:8111"]
    boot = _rendered(data)
    policy = _cluster(boot)["load_balancing_policy"]["policies"][0]["typed_extension_config"]
    assert policy["name"] == "envoy.load_balancing_policies.override_host"
    cfg = policy["typed_config"]
    assert cfg["override_host_sources"] == [{"header": "x-gateway-destination-endpoint"}]
    fallback = cfg["fallback_policy"]["policies"][0]["typed_extension_config"]
    assert fallback["name"] == "envoy.load_balancing_policies.least_request"
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(boot))
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]


def test_replica_metrics_needs_ip_endpoints() -> None:
    with pytest.raises(ConfigError, match="replica_metrics needs IP endpoints, not 'model-b.internal:8000'"):
        parse_config(_config(replica_metrics={"kind": "vllm"}))
