"""The response cache's settings (docs/cache.md): a model's `cache:` policy and the top-level
`response_cache:` store. Parsed as parts of `ModelConfig` and `GatewayConfig` in contracts.config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

CacheScope = Literal["tenant", "key", "shared"]
# Modes this build answers; `semantic` is named in the issue but not built yet: refused by name.
_MODES = ("exact",)


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

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, v: str) -> str:
        if v == "semantic":
            raise ValueError("mode 'semantic' is not available in this build yet (only 'exact'): "
                             "use mode: exact, or drop the cache section")
        if v not in _MODES:
            raise ValueError(f"unknown mode {v!r} (known: {', '.join(_MODES)})")
        return v

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
