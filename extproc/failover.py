"""Which deployments can stand in for a failed one within the same request, inside Envoy.

A deployment with same-protocol peers gets an Envoy aggregate cluster `<cluster>~failover`:
itself first, then the peers. Envoy retries (connect failure, reset, 5xx) move to the next member
via the `previous_priorities` retry plugin, so the body needs no new translation. Peers must speak
the same protocol, name the same upstream model and use the same credential; a standard-channel
request never fails over onto the fast channel.
"""

from __future__ import annotations

from extproc.config import Deployment, GatewayConfig

SUFFIX = "~failover"


def _compatible(primary: Deployment, peer: Deployment) -> bool:
    return (peer.cluster != primary.cluster and peer.protocol == primary.protocol
            and peer.upstream_model == primary.upstream_model
            and (peer.api_key_env, peer.api_key_file) == (primary.api_key_env, primary.api_key_file)
            and (peer.channel == "standard" or primary.channel == "fast"))


def failover_groups(cfg: GatewayConfig) -> dict[str, list[str]]:
    """Primary cluster -> ordered member clusters, for every deployment that has a peer."""
    groups: dict[str, list[str]] = {}
    for model in cfg.models:
        for dep in model.deployments:
            peers = [p.cluster for p in model.deployments if _compatible(dep, p)]
            if peers:
                members = groups.setdefault(dep.cluster, [dep.cluster])
                members += [p for p in peers if p not in members]
    return groups


def aggregate_name(cluster: str) -> str:
    return cluster + SUFFIX
