"""What is configured: the models a tenant may use, and the deployment behind an Envoy cluster."""

from __future__ import annotations

from contracts.config import Deployment, GatewayConfig, ModelConfig, TenantConfig
from contracts.envoy_names import aggregate_name, parse_xlate
from contracts.errors import UnknownModel, UpstreamError
from contracts.failover import failover_groups


class Catalog:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.models: dict[str, ModelConfig] = {m.name: m for m in config.models}
        # Deployments with peers are sent to their Envoy failover (aggregate) cluster.
        groups = failover_groups(config)
        self._envoy_cluster = {c: aggregate_name(c) for c in groups}
        # Endpoint -> cluster for failover members: tells who answered after an Envoy retry.
        clusters = config.clusters()
        self._endpoint_cluster = {ep: c for members in groups.values() for c in members if c in clusters
                                  for ep in clusters[c].endpoints}

    def visible(self, tenant: TenantConfig) -> list[ModelConfig]:
        return [m for m in self.config.models if tenant.may_use(m.name)]

    def model_for(self, tenant: TenantConfig | None, name: str) -> ModelConfig:
        """A model the tenant may use; unknown and forbidden look the same so keys can't probe."""
        model = self.models.get(name)
        if model is None or tenant is None or not tenant.may_use(name):
            raise UnknownModel(f"The model `{name}` does not exist or you do not have access to it.")
        return model

    def deployment(self, cluster: str) -> tuple[ModelConfig, Deployment]:
        """The model and deployment a cluster belongs to (the first model, if several share it)."""
        for m in self.config.models:
            for d in m.deployments:
                if d.cluster == cluster:
                    return m, d
        raise UpstreamError(f"no deployment for cluster {cluster!r}")

    def envoy_cluster(self, cluster: str) -> str:
        """The cluster Envoy's route should pick: the failover aggregate when there is one."""
        return self._envoy_cluster.get(cluster, cluster)

    def served_by(self, upstream_host: str) -> str | None:
        """The cluster behind Envoy's %UPSTREAM_HOST%: an endpoint, or a translation hop's
        internal listener (`envoy://xlate~<protocol>~<cluster>/...`)."""
        if upstream_host.startswith("envoy://"):
            hop = parse_xlate(upstream_host[len("envoy://"):].split("/", 1)[0])
            return hop[1] if hop else None
        return self._endpoint_cluster.get(upstream_host)
