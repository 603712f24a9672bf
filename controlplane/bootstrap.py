"""Envoy bootstrap rendering: `modelyard.yaml` plus `envoy/environments/NAME.yaml` -> Envoy YAML.

Built with envoy-data-plane's typed messages (off the request path), so a wrong field name fails
here rather than in Envoy. The routing contract: the extproc sets `x-modelyard-cluster` and clears
the route cache; the route picks the cluster from that header.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import logging

import yaml

# Registers every typed_config type the bootstrap uses, so Any fields resolve in bootstrap_dict.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.access_loggers.file.v3 import file_pb2  # noqa: F401
from envoy.extensions.bootstrap.internal_listener.v3 import internal_listener_pb2  # noqa: F401
from envoy.extensions.clusters.aggregate.v3 import cluster_pb2  # noqa: F401
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2  # noqa: F401
from envoy.extensions.filters.http.grpc_http1_reverse_bridge.v3 import config_pb2  # noqa: F401
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2  # noqa: F401
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.least_request.v3 import least_request_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.override_host.v3 import override_host_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.random.v3 import random_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.ring_hash.v3 import ring_hash_pb2  # noqa: F401
from envoy.extensions.load_balancing_policies.round_robin.v3 import round_robin_pb2  # noqa: F401
from envoy.extensions.retry.host.previous_hosts.v3 import previous_hosts_pb2  # noqa: F401
from envoy.extensions.retry.priority.previous_priorities.v3 import previous_priorities_config_pb2  # noqa: F401
from envoy.extensions.transport_sockets.internal_upstream.v3 import internal_upstream_pb2  # noqa: F401
from envoy.extensions.transport_sockets.raw_buffer.v3 import raw_buffer_pb2  # noqa: F401
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2  # noqa: F401
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from envoy_data_plane.envoy.config.bootstrap.v3 import Admin, Bootstrap, BootstrapStaticResources
from envoy_data_plane.envoy.config.cluster.v3 import (
    CircuitBreakers,
    CircuitBreakersThresholds,
    CircuitBreakersThresholdsRetryBudget,
    Cluster,
    ClusterCustomClusterType,
    ClusterDiscoveryType,
    ClusterLbPolicy,
    ClusterOriginalDstLbConfig,
    OutlierDetection,
)
from envoy_data_plane.envoy.config.common.mutation_rules.v3 import HeaderMutationRules
from envoy_data_plane.envoy.config.core.v3 import (
    Address,
    ApiVersion,
    BackoffStrategy,
    DataSource,
    EnvoyInternalAddress,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    HeaderValue,
    HeaderValueOption,
    HeaderValueOptionHeaderAppendAction,
    HealthCheck,
    HealthCheckGrpcHealthCheck,
    Http2ProtocolOptions,
    Pipe,
    SocketAddress,
    TransportSocket,
    TypedExtensionConfig,
)
from envoy_data_plane.envoy.config.core.v3 import HttpProtocolOptions as HttpProtocolOptionsCore
from envoy_data_plane.envoy.config.core.v3 import RetryPolicy as CoreRetryPolicy
from envoy_data_plane.envoy.config.core.v3 import (
    RetryPolicyRetryHostPredicate as CoreRetryHostPredicate,
)
from envoy_data_plane.envoy.config.endpoint.v3 import ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints
from envoy_data_plane.envoy.config.listener.v3 import Filter, FilterChain, Listener, ListenerInternalListenerConfig
from envoy_data_plane.envoy.config.ratelimit.v3 import RateLimitServiceConfig
from envoy_data_plane.envoy.config.route.v3 import (
    DirectResponseAction,
    HeaderMatcher,
    RateLimit,
    RateLimitAction,
    RateLimitActionRequestHeaders,
    RetryPolicy,
    RetryPolicyRetryHostPredicate,
    RetryPolicyRetryPriority,
    Route,
    RouteAction,
    RouteConfiguration,
    RouteMatch,
    VirtualHost,
)
from envoy_data_plane.envoy.extensions.bootstrap.internal_listener.v3 import InternalListener
from envoy_data_plane.envoy.extensions.clusters.aggregate.v3 import ClusterConfig as AggregateClusterConfig
from envoy_data_plane.envoy.extensions.filters.http.ext_proc.v3 import (
    ExternalProcessor,
    ExtProcOverrides,
    ExtProcPerRoute,
)
from envoy_data_plane.envoy.extensions.filters.http.grpc_http1_reverse_bridge.v3 import (
    FilterConfig as GrpcBridgeConfig,
)
from envoy_data_plane.envoy.extensions.filters.http.ratelimit.v3 import RateLimit as RateLimitFilter
from envoy_data_plane.envoy.extensions.filters.http.ratelimit.v3 import RateLimitXRateLimitHeadersRfcVersion
from envoy_data_plane.envoy.extensions.filters.http.router.v3 import Router
from envoy_data_plane.envoy.extensions.filters.network.http_connection_manager.v3 import (
    HttpConnectionManager,
    HttpFilter,
)
from envoy_data_plane.envoy.extensions.retry.host.previous_hosts.v3 import PreviousHostsPredicate
from envoy_data_plane.envoy.extensions.retry.priority.previous_priorities.v3 import PreviousPrioritiesConfig
from envoy_data_plane.envoy.extensions.transport_sockets.internal_upstream.v3 import InternalUpstreamTransport
from envoy_data_plane.envoy.extensions.transport_sockets.raw_buffer.v3 import RawBuffer
from envoy_data_plane.envoy.extensions.upstreams.http.v3 import (
    HttpProtocolOptions,
    HttpProtocolOptionsExplicitHttpConfig,
)
from envoy_data_plane.google.protobuf import Any as AnyMsg
from google.protobuf import json_format

from adapters.registry import CHAT_PATHS
from contracts.config import Deployment, GatewayConfig
from contracts.config.mcp import longest_call_s
from contracts.envoy_names import (
    BODIES_METADATA,
    BUFFER_LIMIT_METADATA,
    CLUSTER_HEADER,
    EXT_PROC_FILTER,
    EXTPROC_CLUSTER,
    MCP_RELAY_CLUSTER,
    MCP_RELAY_HEADER,
    SOURCE_ADDRESS_ATTRIBUTE,
    TENANT_HEADER,
    UPSTREAM_ATTEMPTS_HEADER,
    UPSTREAM_HOST_HEADER,
    WAIT_MARGIN_S,
    XLATE_METADATA,
    aggregate_name,
    grpc_bridge_cluster,
    xlate_metadata,
    xlate_name,
)
from contracts.errors import ConfigError
from contracts.failover import failover_groups, translation_hops
from contracts.workers import worker_addresses, worker_count, worker_sockets
from controlplane.access_log import access_log
from controlplane.balancing import apply_balancing, endpoint_weight, hash_policies
from controlplane.compression import compressor_filters, decompressor_filters
from controlplane.environments import EnvironmentConfig, RateLimitServiceSettings
from controlplane.inference_pool import pool_resources
from controlplane.local_replies import extproc_down_replies, status_on_error
from controlplane.overload import overload_manager
from controlplane.processing_modes import buffered_mode, duplex_mode
from controlplane.stats_listener import admin_cluster, stats_listener
from controlplane.upstream_tls import TlsSettings, tls_transport_socket

log = logging.getLogger("modelyard.controlplane")

# Clusters that speak gRPC need HTTP/2 upstream; Envoy defaults to HTTP/1.1.
H2_PROTOCOLS = {"kserve-grpc"}
# The client-facing listener; its route config keeps this name too (served over RDS when live).
MAIN_LISTENER = "modelyard"


def _secs(s: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=s)


def _socket(address: str, port: int) -> Address:
    return Address(socket_address=SocketAddress(address=address, port_value=port))


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _retry_budget() -> CircuitBreakers:
    """Retries scale with load (25% of active requests, at least 16 at once): the default fixed
    cap of 3 concurrent retries drops failovers exactly when an upstream dies under load."""
    from envoy_data_plane.envoy.type.v3 import Percent

    return CircuitBreakers(thresholds=[CircuitBreakersThresholds(
        retry_budget=CircuitBreakersThresholdsRetryBudget(budget_percent=Percent(value=25.0), min_retry_concurrency=16),
        track_remaining=True)])


def _cluster(name: str, endpoints: list[str], *, h2: bool, tls: TlsSettings | None, env: EnvironmentConfig,
             outlier: bool, dep: Deployment | None = None) -> Cluster:
    hosts = [_split(e) for e in endpoints]
    weights = [endpoint_weight(dep, e) if dep else None for e in endpoints]
    static = all(_is_ip(h) for h, _ in hosts)
    cluster = Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC if static else ClusterDiscoveryType.STRICT_DNS,
        connect_timeout=_secs(env.timeouts.connect_s),
        lb_policy=ClusterLbPolicy.ROUND_ROBIN,
        per_connection_buffer_limit_bytes=env.buffer_limit_bytes,
        circuit_breakers=_retry_budget(),
        load_assignment=ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[LocalityLbEndpoints(lb_endpoints=[
                LbEndpoint(endpoint=Endpoint(address=_socket(h, p)), load_balancing_weight=w)
                for (h, p), w in zip(hosts, weights, strict=True)
            ])],
        ),
    )
    if h2:
        opts = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()))
        cluster.typed_extension_protocol_options = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": AnyMsg.pack(opts)}
    if tls:
        # gRPC servers insist on ALPN h2 over TLS.
        cluster.transport_socket = tls_transport_socket(dataclasses.replace(tls, alpn=("h2",)) if h2 else tls)
    if outlier:
        # Eject an endpoint that keeps failing so retries land on a healthy one.
        cluster.outlier_detection = OutlierDetection(consecutive_5xx=5, base_ejection_time=_secs(10))
    if dep is not None:
        apply_balancing(cluster, dep)
    return cluster


def _deployment_tls(name: str, dep: Deployment) -> TlsSettings | None:
    if not dep.tls:
        return None
    return TlsSettings(owner=f"deployment {name}", hosts=tuple(_split(e)[0] for e in dep.endpoints),
                       ca_file=dep.tls_ca_file, client_cert_file=dep.tls_client_cert_file,
                       client_key_file=dep.tls_client_key_file, insecure_skip_verify=dep.tls_insecure_skip_verify)


def _extproc_tls(env: EnvironmentConfig, endpoints: list[str]) -> TlsSettings | None:
    hosts = tuple(_split(e)[0] for e in endpoints)
    if env.extproc_tls is None:
        if any(not _is_loopback(h) for h in hosts):
            log.warning("environment %s: extproc endpoints %s are not on loopback and Envoy reaches them in "
                        "plaintext: set extproc_tls (mTLS) or keep them on a private network", env.name,
                        ", ".join(endpoints))
        return None
    t = env.extproc_tls
    return TlsSettings(owner=f"environment {env.name} extproc", hosts=hosts, ca_file=t.ca_file,
                       client_cert_file=t.cert_file, client_key_file=t.key_file, server_name=t.server_name)


def _is_loopback(host: str) -> bool:
    return host == "localhost" or (_is_ip(host) and ipaddress.ip_address(host).is_loopback)


def _internal_cluster(name: str, env: EnvironmentConfig, *, h2: bool = False) -> Cluster:
    """A cluster whose one endpoint is the internal listener `name`."""
    cluster = Cluster(
        name=name,
        type=ClusterDiscoveryType.STATIC,
        connect_timeout=_secs(env.timeouts.connect_s),
        per_connection_buffer_limit_bytes=env.buffer_limit_bytes,
        circuit_breakers=_retry_budget(),
        load_assignment=ClusterLoadAssignment(cluster_name=name, endpoints=[LocalityLbEndpoints(
            lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=Address(
                envoy_internal_address=EnvoyInternalAddress(server_listener_name=name))))])]),
        transport_socket=TransportSocket(
            name="envoy.transport_sockets.internal_upstream",
            typed_config=AnyMsg.pack(InternalUpstreamTransport(transport_socket=TransportSocket(
                name="envoy.transport_sockets.raw_buffer", typed_config=AnyMsg.pack(RawBuffer()))))),
    )
    if h2:  # trailers (grpc-status) need HTTP/2 on the way back to the outer router
        opts = HttpProtocolOptions(explicit_http_config=HttpProtocolOptionsExplicitHttpConfig(
            http2_protocol_options=Http2ProtocolOptions()))
        cluster.typed_extension_protocol_options = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": AnyMsg.pack(opts)}
    return cluster


def _grpc_bridged(cfg: GatewayConfig) -> list[str]:
    """REST KServe clusters: gRPC callers reach them through a bridge listener each."""
    return [name for name, dep in cfg.clusters().items() if dep.protocol == "kserve-rest"]


def _upstream_clusters(cfg: GatewayConfig, env: EnvironmentConfig) -> list[Cluster]:
    out = []
    for name, dep in cfg.clusters().items():
        out.append(_cluster(name, dep.endpoints, h2=dep.protocol in H2_PROTOCOLS, tls=_deployment_tls(name, dep),
                            env=env, outlier=True, dep=dep))
    for from_protocol, target in translation_hops(cfg):
        out.append(_internal_cluster(xlate_name(from_protocol, target), env))
    for cluster in _grpc_bridged(cfg):
        out.append(_internal_cluster(grpc_bridge_cluster(cluster), env, h2=True))
    for primary, members in failover_groups(cfg).items():
        out.append(Cluster(
            name=aggregate_name(primary),
            connect_timeout=_secs(env.timeouts.connect_s),
            lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED,
            circuit_breakers=_retry_budget(),
            cluster_type=ClusterCustomClusterType(
                name="envoy.clusters.aggregate",
                typed_config=AnyMsg.pack(AggregateClusterConfig(clusters=members))),
        ))
    return out


def longest_queue_wait_s(cfg: GatewayConfig) -> float:
    """The longest a request may wait in a deployment's queue (extproc.admission.concurrency), 0 without queues."""
    return max((max(d.queue.max_wait_s.values()) for d in cfg.clusters().values() if d.max_inflight), default=0.0)


def _ext_proc_filter(env: EnvironmentConfig, xlate: str | None = None, queue_wait_s: float = 0.0,
                     long_poll_s: float = 0.0) -> HttpFilter:
    # A replica that is gone (killed, or draining: its port is closed) refuses the connection before
    # a message was sent: open the stream on another replica instead of failing the request. So does
    # a stream opened on a killed replica's connection before Envoy read its close (reset, with no
    # answer from the extproc yet: Envoy retries only before the first response bytes).
    # Retries wait 25-250 ms, not the 1 s base a core RetryPolicy has by default: a dead worker's
    # requests reach a live one at once, and with none alive Envoy's 503 comes quickly.
    retry = CoreRetryPolicy(retry_on="connect-failure,refused-stream,reset,unavailable", num_retries=3,
                            retry_back_off=BackoffStrategy(base_interval=datetime.timedelta(milliseconds=25),
                                                           max_interval=datetime.timedelta(milliseconds=250)),
                            retry_host_predicate=[CoreRetryHostPredicate(
                                name="envoy.retry_host_predicates.previous_hosts",
                                typed_config=AnyMsg.pack(PreviousHostsPredicate()))],
                            host_selection_retry_max_attempts=3)
    grpc = GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXTPROC_CLUSTER, retry_policy=retry),
                       timeout=_secs(env.timeouts.extproc_message_s))
    if xlate:
        # A translation hop's streams say so in their gRPC metadata: the extproc re-renders them.
        grpc.initial_metadata = [HeaderValue(key=XLATE_METADATA, value=xlate)]
    ext = ExternalProcessor(
        grpc_service=grpc,
        failure_mode_allow=False,
        # No extproc answered (all dead or restarting, or one died mid-request): 503, which the
        # listener's local reply mapper turns into JSON with retry-after (controlplane.local_replies).
        status_on_error=status_on_error(),
        processing_mode=buffered_mode(),
        # Streams (SSE) switch the response body to STREAMED from the response-headers reply.
        allow_mode_override=True,
        # A queued request's body reply comes only when it gets a slot: the queue's max wait on top.
        message_timeout=_secs(env.timeouts.extproc_message_s + queue_wait_s),
        # A task long poll extends its message's timer once, to its wait plus a margin.
        max_message_timeout=_secs(max(env.timeouts.extproc_message_s + queue_wait_s, long_poll_s + WAIT_MARGIN_S)),
        # The extproc sets x-envoy-upstream-rq-timeout-ms (the deployment's timeout_ms) for the router.
        # Bedrock's SigV4 signs Host: the extproc sets the Host it signed (allow_all_routing permits it).
        mutation_rules=HeaderMutationRules(allow_envoy=True, allow_all_routing=True),
    )
    if not xlate:
        # The caller's address for the audit log, as Envoy resolved it (trusted XFF hops applied).
        ext.request_attributes = [SOURCE_ADDRESS_ATTRIBUTE]
    return HttpFilter(name=EXT_PROC_FILTER, typed_config=AnyMsg.pack(ext))


def _rate_limit_filter(rls: RateLimitServiceSettings) -> HttpFilter:
    f = RateLimitFilter(
        domain=rls.domain,
        timeout=_secs(rls.timeout_s),
        failure_mode_deny=rls.failure_mode_deny,
        enable_x_ratelimit_headers=RateLimitXRateLimitHeadersRfcVersion.DRAFT_VERSION_03,  # on every reply
        rate_limit_service=RateLimitServiceConfig(
            grpc_service=GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=EXTPROC_CLUSTER)),
            transport_api_version=ApiVersion.V3,
        ),
    )
    return HttpFilter(name="envoy.filters.http.ratelimit", typed_config=AnyMsg.pack(f))


def _routes(cfg: GatewayConfig, env: EnvironmentConfig) -> RouteConfiguration:
    action = RouteAction(
        cluster_header=CLUSTER_HEADER,
        # Hosted APIs route on Host: send the upstream's own name, not the gateway's.
        auto_host_rewrite=True,
        timeout=_secs(env.timeouts.route_s),
        idle_timeout=_secs(env.timeouts.stream_idle_s),
        # Before the first byte of an answer: retry elsewhere. Across an aggregate cluster,
        # previous_priorities moves each retry to the next member (the next deployment).
        retry_policy=RetryPolicy(
            retry_on="connect-failure,refused-stream,reset,5xx", num_retries=env.retries,
            retry_priority=RetryPolicyRetryPriority(
                name="envoy.retry_priorities.previous_priorities",
                typed_config=AnyMsg.pack(PreviousPrioritiesConfig(update_frequency=1))),
            retry_host_predicate=[RetryPolicyRetryHostPredicate(
                name="envoy.retry_host_predicates.previous_hosts",
                typed_config=AnyMsg.pack(PreviousHostsPredicate()))],
            host_selection_retry_max_attempts=3,
        ),
        hash_policy=hash_policies(cfg),
    )
    if env.rate_limit_service:
        # Descriptors the extproc stamps on the request: tenant and chosen cluster.
        action.rate_limits = [RateLimit(actions=[
            RateLimitAction(request_headers=RateLimitActionRequestHeaders(
                header_name=TENANT_HEADER, descriptor_key="tenant")),
            RateLimitAction(request_headers=RateLimitActionRequestHeaders(
                header_name=CLUSTER_HEADER, descriptor_key="cluster")),
        ])]
    # Tells the extproc which endpoint answered (a failover cluster's member) and after how many tries.
    answered_by = [HeaderValueOption(header=HeaderValue(key=k, value=v),
                                     append_action=HeaderValueOptionHeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD)
                   for k, v in ((UPSTREAM_HOST_HEADER, "%UPSTREAM_HOST%"),
                                (UPSTREAM_ATTEMPTS_HEADER, "%UPSTREAM_REQUEST_ATTEMPT_COUNT%"))]
    not_routed = '{"error":{"message":"no upstream was chosen for this request","type":"invalid_request_error","code":"no_route"}}'
    return RouteConfiguration(
        name=MAIN_LISTENER,
        virtual_hosts=[VirtualHost(
            name="models",
            domains=["*"],
            routes=[
                Route(match=RouteMatch(prefix="/", headers=[HeaderMatcher(name=CLUSTER_HEADER, present_match=True)]),
                      route=action, response_headers_to_add=answered_by,
                      # Routing inputs stay inside the gateway: the upstream never sees them.
                      request_headers_to_remove=[CLUSTER_HEADER, TENANT_HEADER]),
                *_duplex_routes(cfg, env, not_routed),
                Route(match=RouteMatch(prefix="/"),
                      direct_response=DirectResponseAction(status=404, body=DataSource(inline_string=not_routed))),
            ],
        )],
    )


def _duplex_routes(cfg: GatewayConfig, env: EnvironmentConfig, not_routed: str) -> list[Route]:
    """Routes that match only before the extproc picks a cluster: their per-route override sets the
    ext_proc modes of the stream (Envoy fixes them at the request headers, so a route picked later
    cannot) and marks the stream for the extproc in its gRPC metadata (extproc/duplex.py). The chat APIs'
    paths: small bodies both ways, answers that may stream. Not embeddings: an answer past max_body_bytes
    passes through Envoy untouched (body mode NONE), which a duplex body cannot do."""
    if cfg.extproc.bodies != "duplex":
        return []
    override = AnyMsg.pack(ExtProcPerRoute(overrides=ExtProcOverrides(
        processing_mode=duplex_mode(), grpc_initial_metadata=[HeaderValue(key=BODIES_METADATA, value="duplex"),
                                                        HeaderValue(key=BUFFER_LIMIT_METADATA,
                                                                    value=str(env.buffer_limit_bytes))])))
    # A compressed body stays buffered: the decompressor ends it with trailers, and a duplex body
    # ended by trailers does not reach the upstream (Envoy 1.40; the route matches on the headers as sent).
    plain = [HeaderMatcher(name="content-encoding", present_match=True, invert_match=True)]
    return [Route(match=RouteMatch(path=p, headers=plain), typed_per_filter_config={EXT_PROC_FILTER: override},
                  direct_response=DirectResponseAction(status=404, body=DataSource(inline_string=not_routed)))
            for p in CHAT_PATHS]


def _hop_listener(from_protocol: str, target: str, cfg: GatewayConfig, env: EnvironmentConfig) -> Listener:
    """An internal listener: a failover retry arrives in `from_protocol`; its ext_proc stream
    re-renders it for `target` and translates the answer back; the route goes to `target`."""
    name = xlate_name(from_protocol, target)
    return _internal_listener(name, target, [_ext_proc_filter(env, xlate=xlate_metadata(from_protocol, target))], cfg, env)


def _grpc_bridge_listener(cluster: str, cfg: GatewayConfig, env: EnvironmentConfig) -> Listener:
    """A gRPC caller's call to the REST deployment `cluster`: the extproc sent it here as one gRPC
    message holding the REST body; Envoy's reverse bridge unframes it, frames the REST reply and
    adds grpc-status trailers, so the outer ext_proc stream sees an ordinary gRPC reply (an
    ext_proc filter cannot add trailers, and the bridge beside it on the outer listener stalls
    the reply: trailers added while ext_proc holds the headers never reach it)."""
    bridge = GrpcBridgeConfig(content_type="application/json", withhold_grpc_frames=True)
    return _internal_listener(grpc_bridge_cluster(cluster), cluster, [HttpFilter(
        name="envoy.filters.http.grpc_http1_reverse_bridge", typed_config=AnyMsg.pack(bridge))], cfg, env)


def _internal_listener(name: str, cluster: str, filters: list[HttpFilter], cfg: GatewayConfig,
                       env: EnvironmentConfig) -> Listener:
    """An Envoy internal listener named `name`: `filters`, then the router, to `cluster`."""
    route = RouteConfiguration(name=name, virtual_hosts=[VirtualHost(name=name, domains=["*"], routes=[Route(
        match=RouteMatch(prefix="/"),
        route=RouteAction(cluster=cluster, auto_host_rewrite=True, timeout=_secs(env.timeouts.route_s),
                          idle_timeout=_secs(env.timeouts.stream_idle_s), hash_policy=hash_policies(cfg)))])])
    hcm = HttpConnectionManager(
        stat_prefix=name,
        route_config=route,
        http_filters=[*filters, HttpFilter(name="envoy.filters.http.router", typed_config=AnyMsg.pack(Router()))],
        stream_idle_timeout=_secs(env.timeouts.stream_idle_s),
        request_timeout=_secs(0),
    )
    return Listener(name=name, internal_listener=ListenerInternalListenerConfig(),
                    per_connection_buffer_limit_bytes=env.buffer_limit_bytes,
                    filter_chains=[FilterChain(filters=[Filter(
                        name="envoy.filters.network.http_connection_manager", typed_config=AnyMsg.pack(hcm))])])


@dataclasses.dataclass
class EnvoyResources:
    """Everything Envoy runs for one config and environment: the static bootstrap inlines it, the
    control plane serves it over ADS (controlplane/live/snapshot.py), so the two cannot drift."""

    listeners: list[Listener]
    clusters: list[Cluster]  # upstream, internal (hops, bridges), aggregate, the admin cluster
    extproc: Cluster  # static in both bootstraps: Envoy needs it before any xDS arrives
    internal_listeners: bool  # some listener is an internal one: the bootstrap extension must be on


def build_resources(cfg: GatewayConfig, env: EnvironmentConfig) -> EnvoyResources:
    queue_wait_s = longest_queue_wait_s(cfg)
    if env.edge.request_timeout_s and queue_wait_s >= env.edge.request_timeout_s:
        # Envoy would answer 408 to a request still waiting for its slot, before the queue's own 503.
        raise ConfigError(f"a deployment queue waits up to {queue_wait_s:g}s (queue.max_wait_s), not less than "
                          f"environment {env.name!r} edge.request_timeout_s ({env.edge.request_timeout_s:g}s)")
    tasks = cfg.extproc.tasks
    # Inflate before the extproc reads a body; compress what it answers (encoders run in reverse).
    filters = [*decompressor_filters(env.compression), *compressor_filters(env.compression),
               _ext_proc_filter(env, queue_wait_s=queue_wait_s,
                                # an /mcp POST extends its timer as a long poll does, to its servers' timeout
                                long_poll_s=max(tasks.max_wait_s if tasks is not None else 0.0,
                                                longest_call_s(cfg.mcp_servers)))]
    if env.rate_limit_service:
        filters.append(_rate_limit_filter(env.rate_limit_service))
    filters.append(HttpFilter(name="envoy.filters.http.router", typed_config=AnyMsg.pack(Router())))
    edge = env.edge
    hcm = HttpConnectionManager(
        stat_prefix="modelyard",
        route_config=_routes(cfg, env),
        http_filters=filters,
        stream_idle_timeout=_secs(env.timeouts.stream_idle_s),
        # Both stop once the response starts: slow senders are cut, long streams are not.
        request_headers_timeout=_secs(edge.request_headers_timeout_s),
        request_timeout=_secs(edge.request_timeout_s),
        common_http_protocol_options=HttpProtocolOptionsCore(
            idle_timeout=_secs(edge.idle_timeout_s), max_requests_per_connection=edge.max_requests_per_connection),
        use_remote_address=edge.use_remote_address,
        xff_num_trusted_hops=edge.xff_num_trusted_hops,
        access_log=[access_log(env.access_log)] if env.access_log else [],
        local_reply_config=extproc_down_replies(env.buffer_limit_bytes),
    )
    listener = Listener(
        name=MAIN_LISTENER,
        address=_socket(env.listener.address or cfg.listener.address, env.listener.port or cfg.listener.port),
        per_connection_buffer_limit_bytes=env.buffer_limit_bytes,
        filter_chains=[FilterChain(filters=[Filter(
            name="envoy.filters.network.http_connection_manager", typed_config=AnyMsg.pack(hcm))])],
    )
    hops = translation_hops(cfg)
    bridged = _grpc_bridged(cfg)
    listeners = [listener, *(_hop_listener(f, t, cfg, env) for f, t in hops),
                 *(_grpc_bridge_listener(c, cfg, env) for c in bridged)]
    clusters = _upstream_clusters(cfg, env)
    if cfg.mcp_servers:  # /mcp streams: the extproc names its own relay's address (docs/mcp.md)
        clusters.append(mcp_relay_cluster())
    if env.stats and env.admin:
        listeners.append(stats_listener(env.stats))
        clusters.append(admin_cluster(env.admin))
    if cfg.endpoint_picker is not None and cfg.endpoint_picker.listener:  # docs/routing.md "Endpoint-picker mode"
        pool_listener, pool_clusters = pool_resources(cfg.endpoint_picker, env.timeouts.route_s,
                                                      env.timeouts.extproc_message_s)
        listeners.append(pool_listener)
        clusters.extend(pool_clusters)
    return EnvoyResources(listeners=listeners, clusters=clusters, extproc=extproc_cluster(cfg, env),
                          internal_listeners=bool(hops or bridged))


def mcp_relay_cluster() -> Cluster:
    """The extproc's SSE relay for /mcp streams: the address comes with each request (the extproc
    that authorised it), so the stream and its prepared job are in the same process."""
    return Cluster(name=MCP_RELAY_CLUSTER, type=ClusterDiscoveryType.ORIGINAL_DST,
                   lb_policy=ClusterLbPolicy.CLUSTER_PROVIDED, connect_timeout=_secs(2),
                   original_dst_lb_config=ClusterOriginalDstLbConfig(use_http_header=True,
                                                                     http_header_name=MCP_RELAY_HEADER))


def extproc_cluster(cfg: GatewayConfig, env: EnvironmentConfig) -> Cluster:
    # Listed replicas, else this host's workers (contracts/workers.py: address port + 0..N-1).
    extproc_endpoints = env.extproc_endpoints or worker_addresses(cfg.extproc.address,
                                                                  worker_count(cfg.extproc.workers))
    extproc = _cluster(EXTPROC_CLUSTER, extproc_endpoints, h2=True, tls=_extproc_tls(env, extproc_endpoints),
                       env=env, outlier=False)
    if cfg.extproc.unix_socket and not env.extproc_endpoints and env.extproc_tls is None:
        # A local extproc over its Unix socket: no TCP stack between Envoy and it (docs/performance.md).
        pipes = worker_sockets(cfg.extproc.unix_socket, worker_count(cfg.extproc.workers))
        extproc.type = ClusterDiscoveryType.STATIC
        extproc.load_assignment = ClusterLoadAssignment(cluster_name=EXTPROC_CLUSTER, endpoints=[
            LocalityLbEndpoints(lb_endpoints=[LbEndpoint(endpoint=Endpoint(address=Address(pipe=Pipe(path=p))))
                                              for p in pipes])])
    # gRPC health: a replica that drains (NOT_SERVING) or died leaves the rotation within a second;
    # one refused connection ejects it at once, before the next health check.
    # no_traffic_interval too: Envoy counts ext_proc streams as no traffic and would check once a minute.
    extproc.health_checks = [HealthCheck(timeout=_secs(1), interval=_secs(1), no_traffic_interval=_secs(1),
                                         unhealthy_threshold=1, healthy_threshold=1,
                                         grpc_health_check=HealthCheckGrpcHealthCheck())]
    extproc.outlier_detection = OutlierDetection(split_external_local_origin_errors=True,
                                                 consecutive_local_origin_failure=1, base_ejection_time=_secs(2),
                                                 max_ejection_percent=50, consecutive_5xx=1000)
    return extproc


def admin_of(env: EnvironmentConfig) -> Admin | None:
    if env.admin and env.admin.pipe:
        return Admin(address=Address(pipe=Pipe(path=env.admin.pipe, mode=0o600)))
    if env.admin:
        return Admin(address=_socket(env.admin.address, env.admin.port))
    return None


def internal_listener_extension() -> TypedExtensionConfig:
    return TypedExtensionConfig(name="envoy.bootstrap.internal_listener", typed_config=AnyMsg.pack(InternalListener()))


def build_bootstrap(cfg: GatewayConfig, env: EnvironmentConfig) -> Bootstrap:
    res = build_resources(cfg, env)
    boot = Bootstrap(
        static_resources=BootstrapStaticResources(listeners=res.listeners, clusters=[res.extproc, *res.clusters]),
        overload_manager=overload_manager(env.overload, env.edge))
    if res.internal_listeners:
        boot.bootstrap_extensions = [internal_listener_extension()]
    admin = admin_of(env)
    if admin is not None:
        boot.admin = admin
    return boot


def render_bootstrap(cfg: GatewayConfig, env: EnvironmentConfig) -> str:
    header = (f"# Rendered by `modelyard envoy render --env {env.name}`; do not edit by hand.\n"
              f"# Run: envoy -c <this file> --concurrency {env.concurrency}\n")
    return header + yaml.safe_dump(bootstrap_dict(build_bootstrap(cfg, env)), sort_keys=False)


def bootstrap_dict(boot: Bootstrap) -> dict:
    """Proto-JSON via the official protobuf runtime: betterproto2 misnames fields like `consecutive_5xx`."""
    msg = bootstrap_pb2.Bootstrap.FromString(bytes(boot))
    return json.loads(json_format.MessageToJson(msg, preserving_proto_field_name=True))



def xds_cluster(name: str, address: str, env: EnvironmentConfig) -> Cluster:
    """The control plane's ADS endpoint: gRPC, so HTTP/2; no outlier detection (one endpoint)."""
    return _cluster(name, [address], h2=True, tls=None, env=env, outlier=False)
