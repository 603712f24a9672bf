"""The response cache's Prometheus series (docs/cache.md)."""

from __future__ import annotations

from functools import lru_cache

from prometheus_client import Counter, Gauge, Histogram

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
EMBED = Histogram("modelyard_response_cache_embed_seconds", "Semantic cache: embedding the prompt (the embedder call)",
                  ["embedder"], buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
EMBED_FAILURES = Counter("modelyard_response_cache_embed_failures_total",
                         "Semantic cache: prompts not embedded (the call failed or timed out: exact lookup only)",
                         ["embedder"])
SCORE = Histogram("modelyard_response_cache_semantic_score", "Semantic cache: the nearest stored prompt's similarity "
                  "per lookup (hits and misses: where to set a threshold)", ["model"],
                  buckets=(0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.925, 0.95, 0.97, 0.98, 0.99, 1.0))
INDEX_ROWS = Gauge("modelyard_response_cache_semantic_index_rows", "Semantic cache: vectors in this process's index")
