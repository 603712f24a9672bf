"""A deployment's `lb:` and `health_check:` as Envoy cluster settings: the LB policy, endpoint
weights, active health checks, and the route's hash policy for ring-hash affinity. A deployment
with `replica_metrics` gets Envoy's override-host policy: the endpoint the extproc picked (its
`x-gateway-destination-endpoint` header), else the deployment's own policy as the fallback."""

from __future__ import annotations

import datetime

import betterproto2
from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterLbPolicy,
    ClusterRingHashLbConfig,
    LoadBalancingPolicy,
    LoadBalancingPolicyPolicy,
)
from envoy_data_plane.envoy.config.core.v3 import (
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    HealthCheckHttpHealthCheck,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.route.v3 import RouteActionHashPolicy, RouteActionHashPolicyHeader
from envoy_data_plane.envoy.extensions.load_balancing_policies.least_request.v3 import LeastRequest
from envoy_data_plane.envoy.extensions.load_balancing_policies.override_host.v3 import (
    OverrideHost,
    OverrideHostOverrideHostSource,
)
from envoy_data_plane.envoy.extensions.load_balancing_policies.random.v3 import Random
from envoy_data_plane.envoy.extensions.load_balancing_policies.ring_hash.v3 import RingHash
from envoy_data_plane.envoy.extensions.load_balancing_policies.round_robin.v3 import RoundRobin
from envoy_data_plane.google.protobuf import Any as AnyMsg

from contracts.config import Deployment, GatewayConfig
from contracts.config.balancing import HealthCheckConfig, LbPolicyName
from contracts.envoy_names import DESTINATION_ENDPOINT_HEADER

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
    if dep.replica_metrics is not None:
        cluster.load_balancing_policy = override_host(dep.lb.policy)
    else:
        cluster.lb_policy = _POLICIES[dep.lb.policy]
        if dep.lb.policy == "ring_hash":
            cluster.ring_hash_lb_config = ClusterRingHashLbConfig(minimum_ring_size=1024)
    if dep.health_check is not None:
        cluster.health_checks = [health_check(dep.health_check)]
        # An endpoint dropped from config (a live apply, a DNS answer) leaves at once, healthy or not.
        cluster.ignore_health_on_host_removal = True


def _policy(name: str, config: betterproto2.Message) -> LoadBalancingPolicy:
    return LoadBalancingPolicy(policies=[LoadBalancingPolicyPolicy(
        typed_extension_config=TypedExtensionConfig(name=name, typed_config=AnyMsg.pack(config)))])


def _fallback(policy: LbPolicyName) -> LoadBalancingPolicy:
    if policy == "least_request":
        return _policy("envoy.load_balancing_policies.least_request", LeastRequest())
    if policy == "random":
        return _policy("envoy.load_balancing_policies.random", Random())
    if policy == "ring_hash":
        return _policy("envoy.load_balancing_policies.ring_hash", RingHash(minimum_ring_size=1024))
    return _policy("envoy.load_balancing_policies.round_robin", RoundRobin())


def override_host(fallback: LbPolicyName) -> LoadBalancingPolicy:
    """The picked endpoint when the header names one of the cluster's, else `fallback` (the
    extproc sets no header when its readings are stale: Envoy's own balancer then picks)."""
    return _policy("envoy.load_balancing_policies.override_host", OverrideHost(
        override_host_sources=[OverrideHostOverrideHostSource(header=DESTINATION_ENDPOINT_HEADER)],
        fallback_policy=_fallback(fallback)))


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
