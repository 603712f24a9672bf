"""The bootstrap of an Envoy the control plane configures (`controlplane.enabled`): only what must
be static (the admin, the ext_proc cluster, the control plane's own cluster) and ADS for the rest:
listeners, routes, clusters and endpoints arrive from `modelyard controlplane` (controlplane/live/)."""

from __future__ import annotations

import yaml
from envoy_data_plane.envoy.config.bootstrap.v3 import Bootstrap, BootstrapDynamicResources, BootstrapStaticResources
from envoy_data_plane.envoy.config.core.v3 import (
    AggregatedConfigSource,
    ApiConfigSource,
    ApiConfigSourceApiType,
    ApiVersion,
    ConfigSource,
    GrpcService,
    GrpcServiceEnvoyGrpc,
    Node,
)

from contracts.config import GatewayConfig
from controlplane.bootstrap import (
    admin_of,
    bootstrap_dict,
    build_resources,
    extproc_cluster,
    internal_listener_extension,
    xds_cluster,
)
from controlplane.environments import EnvironmentConfig
from controlplane.overload import overload_manager

XDS_CLUSTER = "modelyard-xds"
NODE_CLUSTER = "modelyard"


def _ads() -> ConfigSource:
    return ConfigSource(ads=AggregatedConfigSource(), resource_api_version=ApiVersion.V3)


def build_ads_bootstrap(cfg: GatewayConfig, env: EnvironmentConfig, node_id: str = "modelyard-envoy") -> Bootstrap:
    build_resources(cfg, env)  # the checks the static bootstrap makes: a file one refuses, both refuse
    boot = Bootstrap(
        node=Node(id=node_id, cluster=NODE_CLUSTER),
        static_resources=BootstrapStaticResources(clusters=[
            extproc_cluster(cfg, env), xds_cluster(XDS_CLUSTER, cfg.controlplane.xds_address, env)]),
        dynamic_resources=BootstrapDynamicResources(
            ads_config=ApiConfigSource(
                api_type=ApiConfigSourceApiType.GRPC, transport_api_version=ApiVersion.V3,
                grpc_services=[GrpcService(envoy_grpc=GrpcServiceEnvoyGrpc(cluster_name=XDS_CLUSTER))],
                set_node_on_first_message_only=True),
            cds_config=_ads(), lds_config=_ads()),
        overload_manager=overload_manager(env.overload, env.edge),
        # A later config may add translation hops or gRPC bridges: their internal listeners need it.
        bootstrap_extensions=[internal_listener_extension()],
    )
    admin = admin_of(env)
    if admin is not None:
        boot.admin = admin
    return boot


def render_ads_bootstrap(cfg: GatewayConfig, env: EnvironmentConfig) -> str:
    cp = cfg.controlplane
    header = (f"# Rendered by `modelyard envoy render --env {env.name}` (controlplane.enabled): listeners, routes,\n"
              f"# clusters and endpoints come over ADS from `modelyard controlplane` at {cp.xds_address}.\n"
              f"# Run: envoy -c <this file> --concurrency {env.concurrency}\n")
    return header + yaml.safe_dump(bootstrap_dict(build_ads_bootstrap(cfg, env)), sort_keys=False)
