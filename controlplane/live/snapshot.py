"""One config as xDS resources: what the control plane serves Envoy over ADS.

Built from `controlplane.bootstrap.build_resources`, the very function the static bootstrap inlines,
then reshaped for xDS only where xDS needs it: the client listener's routes move to RDS and every
cluster of plain socket addresses gets its endpoints over EDS (an endpoint move is then an EDS
update: no cluster is rebuilt, no connection pool drained). Resources are xds-protos messages,
serialized deterministically into the DiscoveryResponse's Any values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm_pb2
from google.protobuf.message import Message

from contracts.config import GatewayConfig
from controlplane.bootstrap import MAIN_LISTENER, build_resources
from controlplane.environments import EnvironmentConfig

_PREFIX = "type.googleapis.com/"
LISTENER = _PREFIX + "envoy.config.listener.v3.Listener"
ROUTE = _PREFIX + "envoy.config.route.v3.RouteConfiguration"
CLUSTER = _PREFIX + "envoy.config.cluster.v3.Cluster"
ENDPOINT = _PREFIX + "envoy.config.endpoint.v3.ClusterLoadAssignment"
# Push order, make before break: clusters and their endpoints before the listeners and routes using them.
PUSH_ORDER = (CLUSTER, ENDPOINT, LISTENER, ROUTE)
# Envoy asks for every listener and cluster (wildcard); routes and endpoints by name.
WILDCARD_TYPES = frozenset({LISTENER, CLUSTER})
_HCM = _PREFIX + "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


@dataclass(frozen=True)
class Snapshot:
    """Every resource of one config, by type URL and name. `final` is False for the bridge
    snapshot of an apply: the new config plus what it removes, kept until the extprocs stop using it."""

    version: str
    resources: Mapping[str, Mapping[str, Message]]
    final: bool = True
    _bytes: dict[tuple[str, str], bytes] = field(default_factory=dict, compare=False, repr=False)

    def of(self, type_url: str) -> Mapping[str, Message]:
        return self.resources.get(type_url, {})

    def encoded(self, type_url: str, name: str) -> bytes:
        """The resource's wire bytes (deterministic: the same config gives the same bytes)."""
        key = (type_url, name)
        if key not in self._bytes:
            self._bytes[key] = self.resources[type_url][name].SerializeToString(deterministic=True)
        return self._bytes[key]

    def required_types(self) -> tuple[str, ...]:
        """The types an Envoy holding this snapshot has subscribed to."""
        return tuple(t for t in PUSH_ORDER if t in WILDCARD_TYPES or self.of(t))


def ads_source() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(ads=config_source_pb2.AggregatedConfigSource(),
                                          resource_api_version=config_source_pb2.V3)


def build_snapshot(cfg: GatewayConfig, env: EnvironmentConfig, version: str) -> Snapshot:
    """Raises ConfigError where the static bootstrap would (build_resources)."""
    res = build_resources(cfg, env)
    listeners: dict[str, Message] = {}
    routes: dict[str, Message] = {}
    for lst in res.listeners:
        msg = listener_pb2.Listener.FromString(bytes(lst))
        if msg.name == MAIN_LISTENER:
            routes.update(_routes_to_rds(msg))
        listeners[msg.name] = msg
    clusters: dict[str, Message] = {}
    endpoints: dict[str, Message] = {}
    for c in res.clusters:
        msg = cluster_pb2.Cluster.FromString(bytes(c))
        if _endpoints_over_eds(msg):
            endpoints[msg.name] = _to_eds(msg)
        clusters[msg.name] = msg
    return Snapshot(version, {LISTENER: listeners, ROUTE: routes, CLUSTER: clusters, ENDPOINT: endpoints})


def _routes_to_rds(listener: listener_pb2.Listener) -> dict[str, route_pb2.RouteConfiguration]:
    """Each HCM's inline route config becomes an RDS reference: a route change is then an RDS
    update, not a listener update (which would drain the listener's connections)."""
    out: dict[str, route_pb2.RouteConfiguration] = {}
    for chain in listener.filter_chains:
        for f in chain.filters:
            if f.typed_config.type_url != _HCM:
                continue
            hcm = hcm_pb2.HttpConnectionManager()
            f.typed_config.Unpack(hcm)
            if not hcm.HasField("route_config"):
                continue
            rc = route_pb2.RouteConfiguration()
            rc.CopyFrom(hcm.route_config)
            out[rc.name] = rc
            hcm.ClearField("route_config")
            hcm.rds.config_source.CopyFrom(ads_source())
            hcm.rds.route_config_name = rc.name
            f.typed_config.Pack(hcm)
    return out


def _endpoints_over_eds(c: cluster_pb2.Cluster) -> bool:
    """Static clusters of IP:port endpoints; DNS names, pipes and internal listeners stay inline."""
    if c.WhichOneof("cluster_discovery_type") != "type" or c.type != cluster_pb2.Cluster.STATIC:
        return False
    eps = [lb.endpoint.address for loc in c.load_assignment.endpoints for lb in loc.lb_endpoints]
    return bool(eps) and all(a.HasField("socket_address") for a in eps)


def _to_eds(c: cluster_pb2.Cluster) -> endpoint_pb2.ClusterLoadAssignment:
    cla = endpoint_pb2.ClusterLoadAssignment()
    cla.CopyFrom(c.load_assignment)
    cla.cluster_name = c.name
    c.ClearField("load_assignment")
    c.type = cluster_pb2.Cluster.EDS
    c.eds_cluster_config.eds_config.CopyFrom(ads_source())
    return cla


def bridge(new: Snapshot, old: Snapshot) -> Snapshot:
    """The new snapshot plus every resource the old one has and the new one lacks: served while the
    extprocs still route to what is being removed. The new snapshot itself when nothing is removed."""
    merged: dict[str, dict[str, Message]] = {}
    removed = False
    for t in PUSH_ORDER:
        gone = {n: m for n, m in old.of(t).items() if n not in new.of(t)}
        removed = removed or bool(gone)
        merged[t] = {**gone, **new.of(t)}
    return Snapshot(new.version, merged, final=False) if removed else new
