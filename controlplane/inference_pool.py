"""`endpoint_picker.listener`: the Envoy listener `modelyard up` puts in front of the endpoint
picker's pool, configured as the Gateway API Inference Extension documents its gateway (its e2e
Envoy, test/testdata/envoy.yaml): ext_proc to the picker with request and response bodies
FULL_DUPLEX_STREAMED, and an ORIGINAL_DST cluster that dials the address the picker put in
`x-gateway-destination-endpoint`. The `envoy.lb` metadata is accepted too (receiving namespaces),
for a cluster whose override-host policy reads it."""

from __future__ import annotations

import datetime

from envoy_data_plane.envoy.config.cluster.v3 import (
    Cluster,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
)
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Http2ProtocolOptions,
    SocketAddress,
)
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener
from envoy_data_plane.envoy.config.route.v3 import Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    MetadataOptions,
    MetadataOptionsMetadataNamespaces,
)
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any as AnyMsg

from contracts.config.endpoint_picker import EndpointPickerConfig
from contracts.envoy_names import DESTINATION_ENDPOINT_HEADER, EPP_DESTINATION_NAMESPACE, EPP_SUBSET_NAMESPACE
from controlplane.processing_modes import duplex_mode


def _secs(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def _socket(address: str) -> Address:
    host, _, port = address.rpartition(":")
    return Address(socket_address=SocketAddress(address=host, port_value=int(port)))


def pool_resources(ep: EndpointPickerConfig, route_timeout_s: float,
                   message_timeout_s: float) -> tuple[Listener, list[Cluster]]:
    """The pool's listener, its original-destination cluster and the picker's ext_proc cluster."""
    assert ep.listener is not None
    name = f"inference-pool~{ep.pool}"
    picker, pool = f"{name}~epp", f"{name}~endpoints"
    ext = ExternalProcessor(
        grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=picker), timeout=_secs(10)),
        processing_mode=duplex_mode(),
        metadata_options=MetadataOptions(
            forwarding_namespaces=MetadataOptionsMetadataNamespaces(untyped=[EPP_SUBSET_NAMESPACE]),
            receiving_namespaces=MetadataOptionsMetadataNamespaces(untyped=[EPP_DESTINATION_NAMESPACE])),
        message_timeout=_secs(message_timeout_s))
    hcm = HttpConnectionManager(
        stat_prefix=name,
        route_config=RouteConfiguration(name=name, virtual_hosts=[VirtualHost(name=name, domains=["*"], routes=[
            Route(match=RouteMatch(prefix="/"), route=RouteAction(cluster=pool, timeout=_secs(route_timeout_s)))])]),
        http_filters=[HttpFilter(name="envoy.filters.http.ext_proc", typed_config=AnyMsg.pack(ext)),
                      HttpFilter(name="envoy.filters.http.router", typed_config=AnyMsg.pack(Router()))])
    listener = Listener(name=name, address=_socket(ep.listener), filter_chains=[FilterChain(filters=[Filter(
        name="envoy.filters.network.http_connection_manager", typed_config=AnyMsg.pack(hcm))])])
    endpoints = Cluster(name=pool, type=ClusterDiscoveryType.ORIGINAL_DST, lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
                        connect_timeout=_secs(2), original_dst_lb_config=ClusterOriginalDstLbConfig(
                            use_http_header=True, http_header_name=DESTINATION_ENDPOINT_HEADER))
    h2 = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
        http2_protocol_options=Http2ProtocolOptions()))
    grpc = Cluster(name=picker, type=ClusterDiscoveryType.STATIC, connect_timeout=_secs(2),
                   typed_extension_protocol_options={
                       "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": AnyMsg.pack(h2)},
                   load_assignment=ClusterLoadAssignment(cluster_name=picker, endpoints=[LocalityLbEndpoints(
                       lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=_socket(ep.address)))])]))
    return listener, [endpoints, grpc]
