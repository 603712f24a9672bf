"""The response cache's Prometheus series (docs/cache.md)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import Counter, Histogram

RESULTS = Counter("modelyard_response_cache_requests_total", "Chat calls of cached models, by cache outcome",
                  ["model", "result"])
SAVED = Counter("modelyard_response_cache_saved_usd_total", "Upstream cost the response cache's hits saved",
                ["model", "tenant"])
LOOKUP = Histogram("modelyard_response_cache_lookup_seconds", "Response cache lookups, hit or miss",
                   ["store"], buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1))
STORED = Counter("modelyard_response_cache_stored_total", "Answers written to the response cache", ["model"])


@lru_cache(maxsize=4096)
def result_series(model: str, result: str) -> Counter:
    return RESULTS.labels(model, result)
