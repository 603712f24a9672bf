"""A config with one slot-limited deployment `c` (and an unlimited `free`), for the concurrency tests."""

from __future__ import annotations

from contracts.config import GatewayConfig, parse_config

KEY = "sha256:" + "0" * 64


def slot_config(max_inflight: int = 1, **queue: object) -> GatewayConfig:
    dep = {"cluster": "c", "protocol": "openai", "endpoints": ["127.0.0.1:9"], "max_inflight": max_inflight,
           "queue": queue}
    free = {"cluster": "free", "protocol": "openai", "endpoints": ["127.0.0.1:9"]}
    return parse_config({"models": [{"name": "m", "deployments": [dep, free]}],
                         "tenants": [{"name": "t", "api_keys": [KEY]}]})
