"""A listener that serves Envoy's Prometheus stats and nothing else of the admin interface.

Prometheus must reach `/stats/prometheus` from another host or container, but the admin interface
also answers `/quitquitquit`, `/runtime_modify` and `/config_dump`: keep admin on loopback or a
unix socket and expose this one exact GET path through a listener that proxies to it.
"""

from __future__ import annotations

import datetime

from envoy_data_plane.envoy.config.cluster.v3 import Cluster, ClusterDiscoveryType
from envoy_data_plane.envoy.config.core.v3 import Address, DataSource, Pipe, SocketAddress
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.type.matcher.v3 import StringMatcher
from envoy_data_plane.google.protobuf import Any as AnyMsg

from controlplane.environments import AdminSettings, StatsSettings

ADMIN_CLUSTER = "envoy_admin"
STATS_PATH = "/stats/prometheus"


def _admin_address(admin: AdminSettings) -> Address:
    if admin.pipe:
        return Address(pipe=Pipe(path=admin.pipe))
    # Admin on 0.0.0.0 is still reached over loopback from inside Envoy's own host.
    host = "127.0.0.1" if admin.address in ("0.0.0.0", "") else admin.address
    return Address(socket_address=SocketAddress(address=host, port_value=admin.port))


def admin_cluster(admin: AdminSettings) -> Cluster:
    """The admin interface as an upstream cluster, for the stats listener only."""
    return Cluster(
        name=ADMIN_CLUSTER,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=datetime.timedelta(seconds=1),
        load_assignment=ClusterLoadAssignment(cluster_name=ADMIN_CLUSTER, endpoints=[LocalityLbEndpoints(
            lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=_admin_address(admin)))])]),
    )


def stats_listener(stats: StatsSettings) -> Listener:
    """GET /stats/prometheus goes to the admin cluster; every other request is a 404 from Envoy."""
    only_get = HeaderMatcher(name=":method", string_match=StringMatcher(exact="GET"))
    route = RouteConfiguration(name="stats", virtual_hosts=[VirtualHost(name="stats", domains=["*"], routes=[
        Route(match=RouteMatch(path=STATS_PATH, headers=[only_get]),
              route=RouteAction(cluster=ADMIN_CLUSTER, timeout=datetime.timedelta(seconds=10))),
        Route(match=RouteMatch(prefix="/"), direct_response=DirectResponseAction(
            status=404, body=DataSource(inline_string=f"only GET {STATS_PATH} is served here\n"))),
    ])])
    hcm = HttpConnectionManager(
        stat_prefix="stats",
        route_config=route,
        http_filters=[HttpFilter(name="envoy.filters.http.router", typed_config=AnyMsg.pack(Router()))],
    )
    return Listener(
        name="stats",
        address=Address(socket_address=SocketAddress(address=stats.address, port_value=stats.port)),
        filter_chains=[FilterChain(filters=[Filter(
            name="envoy.filters.network.http_connection_manager", typed_config=AnyMsg.pack(hcm))])],
    )
