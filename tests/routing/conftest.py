"""Builders for small synthetic configs: tables of models and deployments in a few lines."""

from __future__ import annotations

from typing import Any

import pytest

from contracts.config import GatewayConfig, TenantConfig, parse_config
from contracts.watermarks import Reading

KEY = "sha256:" + "0" * 64


def dep(cluster: str, channel: str = "standard", monitored: bool = True, **kw: Any) -> dict:
    d = {"cluster": cluster, "protocol": "openai", "channel": channel, "endpoints": ["127.0.0.1:9"]}
    if monitored:
        d["watermark"] = {"url": f"http://127.0.0.1:1/{cluster}"}
    d.update(kw)
    return d


def model(name: str, deps: list[dict], **kw: Any) -> dict:
    return {"name": name, "deployments": deps, **kw}


def tenant(name: str = "t", tier: str = "L1", allowed: list[str] | None = None, **kw: Any) -> dict:
    return {"name": name, "tier": tier, "api_keys": [KEY], "allowed_models": allowed or ["*"], **kw}


def make_config(models: list[dict], tenants: list[dict] | None = None, routing: dict | None = None) -> GatewayConfig:
    return parse_config({"models": models, "tenants": tenants or [tenant()], "routing": routing or {}})


def tenant_of(config: GatewayConfig, name: str) -> TenantConfig:
    return next(t for t in config.tenants if t.name == name)


def fresh(
    config: GatewayConfig, now: float = 100.0, value: float = 0.1, overrides: dict[str, float] | None = None
) -> dict[str, Reading]:
    """A fresh reading for every cluster; `overrides` sets single clusters' watermarks."""
    over = overrides or {}
    return {c: Reading(over.get(c, value), now) for c in config.clusters()}


@pytest.fixture
def two_models() -> GatewayConfig:
    """A pricey strong model and a cheap fast one in group `chat`, plus a fast deployment."""
    return make_config(
        [
            model(
                "big",
                [dep("big-a"), dep("big-fast", channel="fast")],
                groups=["chat"],
                quality=0.9,
                latency_ms=800,
                cost={"input_per_1k": 3.0, "output_per_1k": 12.0},
                capabilities={"context_window": 32000, "tools": True, "vision": True},
            ),
            model(
                "small",
                [dep("small-a")],
                groups=["chat"],
                quality=0.5,
                latency_ms=100,
                cost={"input_per_1k": 0.1, "output_per_1k": 0.4},
                capabilities={"context_window": 4000, "max_output_tokens": 1024, "tools": False},
            ),
        ],
        tenants=[tenant("gold", "L1"), tenant("silver", "L2"), tenant("bronze", "L3")],
    )
