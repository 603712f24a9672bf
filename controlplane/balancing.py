"""A deployment's `lb:` and `health_check:` as Envoy cluster settings: the LB policy, endpoint
weights, active health checks, and the route's hash policy for ring-hash affinity."""

from __future__ import annotations

import datetime

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterLbPolicy, ClusterRingHashLbConfig
from envoy_data_plane.envoy.config.core.v3 import (
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    HealthCheckHttpHealthCheck,
)
from envoy_data_plane.envoy.config.route.v3 import RouteActionHashPolicy, RouteActionHashPolicyHeader

from contracts.config import Deployment, GatewayConfig
from contracts.config.balancing import HealthCheckConfig

_POLICIES = {
    "round_robin": ClusterLbPolicy.ROUND_ROBIN,
    "least_request": ClusterLbPolicy.LEAST_REQUEST,
    "ring_hash": ClusterLbPolicy.RING_HASH,
    "random": ClusterLbPolicy.RANDOM,
}


def _secs(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def apply_balancing(cluster: Cluster, dep: Deployment) -> None:
    """Set the deployment's LB policy and health checks on its cluster (endpoint weights are
    set where the endpoints are built: `endpoint_weight`)."""
    cluster.lb_policy = _POLICIES[dep.lb.policy]
    if dep.lb.policy == "ring_hash":
        cluster.ring_hash_lb_config = ClusterRingHashLbConfig(minimum_ring_size=1024)
    if dep.health_check is not None:
        cluster.health_checks = [health_check(dep.health_check)]
        # An endpoint dropped from config (a live apply, a DNS answer) leaves at once, healthy or not.
        cluster.ignore_health_on_host_removal = True


def endpoint_weight(dep: Deployment, endpoint: str) -> int | None:
    """The endpoint's `load_balancing_weight`, or None when the deployment gives no weights
    (Envoy then treats every endpoint alike)."""
    if not dep.lb.weights:
        return None
    return dep.lb.weights.get(endpoint, 1)


def health_check(hc: HealthCheckConfig) -> HealthCheck:
    check = HealthCheck(timeout=_secs(hc.timeout_s), interval=_secs(hc.interval_s),
                        # A deployment the scheduler routes nothing to is still checked as often.
                        no_traffic_interval=_secs(hc.interval_s),
                        unhealthy_threshold=hc.unhealthy_threshold, healthy_threshold=hc.healthy_threshold)
    if hc.http_path is not None:
        check.http_health_check = HealthCheckHttpHealthCheck(path=hc.http_path)
    else:
        check.grpc_health_check = HealthCheckGrpcHealthCheck(service_name=hc.grpc_service or "")
    return check


def hash_policies(cfg: GatewayConfig) -> list[RouteActionHashPolicy]:
    """One header hash per distinct `lb.hash_header`: the one route serves every cluster, and
    only ring-hash clusters use the hash (a request without the header is spread at random)."""
    headers = sorted({dep.lb.hash_header for dep in cfg.clusters().values() if dep.lb.hash_header})
    return [RouteActionHashPolicy(header=RouteActionHashPolicyHeader(header_name=h)) for h in headers]
