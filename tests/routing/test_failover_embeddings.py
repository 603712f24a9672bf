"""An embedding model's deployments are no failover peers: embeddings go to the deployment's own
cluster, and peers would steer the chat traffic of a model that shares one of those clusters."""

from __future__ import annotations

from contracts.config import parse_config
from contracts.failover import failover_groups, translation_hops

TENANTS = [{"name": "t", "api_keys": ["0" * 64]}]


def _dep(cluster: str, protocol: str, port: int) -> dict:
    return {"cluster": cluster, "protocol": protocol, "endpoints": [f"127.0.0.1:{port}"]}


def test_embedding_models_make_no_failover_groups() -> None:
    cfg = parse_config({"models": [
        {"name": "chat-mini", "deployments": [_dep("oa", "openai", 1)]},
        {"name": "embed", "task_types": ["embedding"], "deployments": [_dep("oa", "openai", 1),
                                                                       _dep("gm", "gemini", 2)]},
    ], "tenants": TENANTS})
    assert failover_groups(cfg) == {} and translation_hops(cfg) == []


def test_chat_models_keep_their_peers() -> None:
    cfg = parse_config({"models": [
        {"name": "chat", "task_types": ["chat", "embedding"],
         "deployments": [_dep("oa", "openai", 1), _dep("gm", "gemini", 2)]},
    ], "tenants": TENANTS})
    assert failover_groups(cfg) == {"oa": ["oa", "xlate~openai~gm"], "gm": ["gm", "xlate~gemini~oa"]}


def test_responses_deployments_are_translation_hop_peers() -> None:
    cfg = parse_config({"models": [
        {"name": "chat", "deployments": [_dep("rs", "responses", 1), _dep("an", "anthropic", 2)]},
    ], "tenants": TENANTS})
    assert failover_groups(cfg) == {"rs": ["rs", "xlate~responses~an"], "an": ["an", "xlate~anthropic~rs"]}
    assert translation_hops(cfg) == [("anthropic", "rs"), ("responses", "an")]
