"""The names the rendered Envoy config and the extproc share: each one the control plane builds, the
extproc parses back to what it was built from."""

from __future__ import annotations

import pytest

from contracts.envoy_names import (
    aggregate_name,
    parse_xlate,
    parse_xlate_metadata,
    xlate_metadata,
    xlate_name,
)


@pytest.mark.parametrize(("protocol", "cluster"), [
    pytest.param("openai", "demo-claude", id="plain"),
    pytest.param("anthropic", "gpu~pool", id="cluster-with-tilde"),
])
def test_a_translation_hop_name_and_its_metadata_parse_back(protocol: str, cluster: str) -> None:
    assert parse_xlate(xlate_name(protocol, cluster)) == (protocol, cluster)
    assert parse_xlate_metadata(xlate_metadata(protocol, cluster)) == (protocol, cluster)
    # The hop's listener is named after the metadata its streams carry.
    assert xlate_name(protocol, cluster).endswith(xlate_metadata(protocol, cluster))


@pytest.mark.parametrize("name", [
    pytest.param("demo-claude", id="a-cluster"),
    pytest.param(aggregate_name("demo-claude"), id="an-aggregate"),
    pytest.param("xlate~openai", id="no-cluster"),
    pytest.param("xlate~openai~", id="empty-cluster"),
    pytest.param("grpcbridge~demo-kserve", id="a-bridge"),
])
def test_other_names_are_not_translation_hops(name: str) -> None:
    assert parse_xlate(name) is None


def test_metadata_without_a_cluster_is_refused() -> None:
    assert parse_xlate_metadata("openai") is None
    assert parse_xlate_metadata("openai~") is None
