"""Which deployments can stand in for a failed one within the same request, inside Envoy.

A deployment with peers (other deployments of the same model) gets an Envoy aggregate cluster
`<cluster>~failover`: itself first, then the peers. Envoy retries (connect failure, reset, 5xx)
move to the next member via the `previous_priorities` retry plugin.

- A peer that can take the very same bytes (same protocol, upstream model name and credential)
  is a direct member.
- Any other LLM peer (another protocol, model name or credential) is reached through a
  translation hop: an Envoy internal listener `xlate~<protocol>~<cluster>` whose ext_proc stream
  re-renders the request from the primary's protocol for the peer and translates the answer back.
  So the body is translated again for the deployment that actually serves it.

A standard-channel request never fails over onto the fast channel.
"""

from __future__ import annotations

from contracts.config import Deployment, GatewayConfig
from contracts.envoy_names import parse_xlate, xlate_name

# Protocols the translation hop can re-render (the hub-and-spoke chat adapters).
TRANSLATABLE = frozenset({"openai", "anthropic", "gemini", "responses"})


def _channel_ok(primary: Deployment, peer: Deployment) -> bool:
    return peer.channel == "standard" or primary.channel == "fast"


def _same_bytes(primary: Deployment, peer: Deployment) -> bool:
    return (peer.protocol == primary.protocol and peer.upstream_model == primary.upstream_model
            and (peer.api_key_env, peer.api_key_file) == (primary.api_key_env, primary.api_key_file))


def failover_groups(cfg: GatewayConfig) -> dict[str, list[str]]:
    """Primary cluster -> ordered member clusters (direct peers, then translation hops)."""
    groups: dict[str, list[str]] = {}
    for model in cfg.models:
        if "embedding" in model.task_types and "chat" not in model.task_types:
            # Embeddings go to the deployment's own cluster (extproc/flows/embeddings.py): peers here
            # would only steer the chat traffic of a model that shares one of these clusters.
            continue
        for dep in model.deployments:
            direct, hops = [], []
            for peer in model.deployments:
                if peer.cluster == dep.cluster or not _channel_ok(dep, peer):
                    continue
                if _same_bytes(dep, peer):
                    direct.append(peer.cluster)
                elif dep.protocol in TRANSLATABLE and peer.protocol in TRANSLATABLE:
                    hops.append(xlate_name(dep.protocol, peer.cluster))
            if direct or hops:
                members = groups.setdefault(dep.cluster, [dep.cluster])
                members += [m for m in direct + hops if m not in members]
    return groups


def translation_hops(cfg: GatewayConfig) -> list[tuple[str, str]]:
    """(from protocol, target cluster) for every translation hop some failover group uses."""
    hops = {parse_xlate(m) for members in failover_groups(cfg).values() for m in members}
    return sorted(h for h in hops if h is not None)

