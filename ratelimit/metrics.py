"""Prometheus metrics of the rate limiter (default registry, created once per process)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import Counter, Gauge

DECISIONS = Counter(
    "modelyard_ratelimit_decisions",
    "Rate limit decisions by result and the store that made them",
    ["result", "store"],
)
BACKEND_ERRORS = Counter(
    "modelyard_ratelimit_backend_errors",
    "Redis calls that failed; the configured failure policy answered instead",
    ["policy"],
)
DEGRADED = Gauge(
    "modelyard_ratelimit_degraded",
    "1 while Redis is unreachable and the failure policy is in force",
)
RECONCILED_TOKENS = Counter(
    "modelyard_ratelimit_reconciled_tokens",
    "Token estimate corrections applied at response end",
    ["direction"],
)


@lru_cache(maxsize=64)
def decisions_series(allowed: bool, store: str) -> Counter:
    """The decision counter's child, cached: `labels()` costs more than the increment."""
    return DECISIONS.labels("allowed" if allowed else "denied", store)
