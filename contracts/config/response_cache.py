"""The response cache's settings (docs/cache.md): a model's `cache:` policy and the top-level
`response_cache:` store. Parsed as parts of `ModelConfig` and `GatewayConfig` in contracts.config."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CacheScope = Literal["tenant", "key", "shared"]
_MODES = ("exact", "semantic")
DEFAULT_THRESHOLD = 0.95


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CachePolicy(_Model):
    """A model's `cache:`: answers of this model are kept and replayed to identical requests."""

    mode: str = "exact"
    ttl_s: float = Field(300.0, gt=0, le=30 * 24 * 3600)
    # An answer larger than this (the stored form, bytes) is never kept.
    max_entry_bytes: int = Field(256 * 1024, ge=256, le=64 * 1024 * 1024)
    # Who may read an entry: the tenant that stored it (default), the very key, or every caller.
    scope: CacheScope = "tenant"
    # Sampling with temperature > 0 asks for a fresh draw: cached only when the policy says so.
    temperature_above_zero: bool = False
    # mode: semantic: the gateway's own embedding model that embeds the last user message, the
    # `dimensions` asked of it (None: its default), and the cosine similarity a stored prompt needs.
    embedding_model: str | None = None
    embedding_dimensions: int | None = Field(None, ge=1, le=8192)
    threshold: float | None = None
    # An embedding slower than this is no lookup (the exact cache alone answers; the call goes on).
    embedding_timeout_ms: int = Field(500, ge=1, le=10_000)

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        if v not in _MODES:
            raise ValueError(f"unknown mode {v!r} (known: {', '.join(_MODES)})")
        return v

    @field_validator("threshold")
    @classmethod
    def _in_unit_interval(cls, v: float | None) -> float | None:
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"threshold {v} is outside (0, 1]: it is a cosine similarity (1: identical)")
        return v

    @model_validator(mode="after")
    def _semantic_settings(self) -> CachePolicy:
        if self.mode == "semantic" and not self.embedding_model:
            raise ValueError("mode semantic needs embedding_model: the name of an embedding model this "
                             "gateway serves (task_types: [embedding])")
        if self.mode == "exact":
            named = [k for k in ("embedding_model", "embedding_dimensions", "threshold") if getattr(self, k) is not None]
            if named:
                raise ValueError(f"{named[0]} is for mode: semantic (this policy is mode: exact)")
        return self

    @property
    def similarity(self) -> float:
        """The threshold a semantic hit needs."""
        return DEFAULT_THRESHOLD if self.threshold is None else self.threshold

    @field_validator("scope", mode="before")
    @classmethod
    def _known_scope(cls, v: Any) -> Any:
        if v not in ("tenant", "key", "shared"):
            raise ValueError(f"unknown scope {v!r} (tenant, key or shared)")
        return v


class ResponseCacheStore(_Model):
    """Where cached answers live: SQLite in the run dir (one host), or Redis (replicas share it)."""

    store: Literal["sqlite", "redis"] = "sqlite"
    sqlite_path: str = "run/response_cache.sqlite"
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_prefix: str = "modelyard:rcache:"
    # The whole store's bound (stored bytes): past it the oldest entries go first.
    max_bytes: int = Field(256 * 1024 * 1024, ge=64 * 1024)
    # A lookup that takes longer is a miss (Redis away must not hold a request).
    lookup_timeout_ms: int = Field(100, ge=1, le=5000)
    # Semantic entries: the most vectors one partition (scope, model, controls) keeps in each process's
    # index; past it the closest to expiry drop out (they stay exact entries). A lookup scans them all:
    # bench/bench_semantic.py measures what that costs (docs/cache.md).
    semantic_partition_rows: int = Field(20_000, ge=1, le=1_000_000)


class _NamedModel(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def task_types(self) -> Sequence[str]: ...

    @property
    def cache(self) -> CachePolicy | None: ...


def check_embedding_models(models: Sequence[_NamedModel]) -> None:
    """A semantic policy's `embedding_model` is a model of this config that serves embeddings."""
    embedders = sorted(m.name for m in models if "embedding" in m.task_types)
    for i, m in enumerate(models):
        p = m.cache
        if p is None or p.mode != "semantic":
            continue
        target = next((e for e in models if e.name == p.embedding_model), None)
        where = f"models[{i}].cache.embedding_model"
        if target is None:
            raise ValueError(f"{where}: unknown model {p.embedding_model!r} (embedding models here: "
                             f"{', '.join(embedders) or 'none'})")
        if "embedding" not in target.task_types:
            raise ValueError(f"{where}: {p.embedding_model!r} has no embedding deployment (task_types "
                             f"{list(target.task_types)}; embedding models here: {', '.join(embedders) or 'none'})")
