"""A config with one slot-limited deployment `c` (and an unlimited `free`), for the concurrency tests."""

from __future__ import annotations

from contracts.config import GatewayConfig, parse_config

KEY = "sha256:" + "0" * 64


def slot_config(max_inflight: int = 1, **queue: object) -> GatewayConfig:
    dep = {"cluster": "c", "protocol": "openai", "endpoints": ["127.0.0.1:9"], "max_inflight": max_inflight,
           "queue": queue}
    free = {"cluster": "free", "protocol": "openai", "endpoints": ["127.0.0.1:9"]}
    # Redis's 50 ms default timeout fails open on a loaded box (these tests share slots, not failover).
    return parse_config({"models": [{"name": "m", "deployments": [dep, free]}],
                         "tenants": [{"name": "t", "api_keys": [KEY]}],
                         "ratelimit": {"redis": {"timeout_ms": 5000}}})
