"""The `ratelimit:` section of modelyard.yaml, validated with pydantic.

`contracts.config` parses it as part of the whole file; `parse_config` parses the section alone
(tests, tools) and raises `ConfigError` naming the key path on any error.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from contracts.errors import ConfigError

Scope = Literal["tenant", "tier", "cluster", "channel", "global"]
Unit = Literal["requests", "tokens"]
SCOPES: tuple[Scope, ...] = ("tenant", "tier", "cluster", "channel", "global")
UNITS: tuple[Unit, ...] = ("requests", "tokens")

# Redis Lua numbers are doubles: levels in [-burst, burst] (nano-units) stay exact below 2**53.
MAX_BURST = 4_500_000


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RedisConfig(_Model):
    url: str = "redis://127.0.0.1:6379/0"
    # How many extproc replicas share the limits; the local fallback divides rates by it.
    replicas: int = Field(1, ge=1)
    failure_policy: Literal["fallback", "fail_closed"] = "fallback"
    timeout_ms: int = Field(50, ge=1, le=60_000)
    # Every key of one decision shares this hash tag, so one Lua call covers them in Cluster.
    key_prefix: str = "{my}"
    # After a Redis failure, skip Redis for this long before trying it again.
    retry_interval_ms: int = Field(1000, ge=0)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        return v


class LimitRule(_Model):
    scope: Scope
    match: str = "*"
    # Only with scope tenant and match '*': each tenant OF THIS TIER gets its own bucket.
    tier: str | None = None
    unit: Unit = "requests"
    rate: float = Field(gt=0, le=1e9)
    burst: float = Field(gt=0, le=MAX_BURST)

    @model_validator(mode="after")
    def _check(self) -> LimitRule:
        if self.scope == "global" and self.match != "*":
            raise ValueError("a global rule matches '*' only")
        if not self.match:
            raise ValueError("match must not be empty")
        if self.tier is not None and (self.scope != "tenant" or self.match != "*"):
            raise ValueError("tier applies to scope tenant with match '*' only")
        if round(self.rate * 1000) < 1:
            raise ValueError("rate must be at least 0.001 per second")
        return self


class RateLimitConfig(_Model):
    enabled: bool = True
    # extproc: the extproc charges every request itself. envoy: a route's native ratelimit filter
    # asks our RLS instead (same buckets); the extproc then does not charge, so nothing counts twice.
    enforce: Literal["extproc", "envoy"] = "extproc"
    backend: Literal["memory", "redis"] = "memory"
    redis: RedisConfig = RedisConfig()
    limits: list[LimitRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _no_duplicate_rules(self) -> RateLimitConfig:
        seen: set[tuple[str, str, str]] = set()
        for i, r in enumerate(self.limits):
            k = (r.scope, r.match if r.tier is None else f"tier={r.tier}", r.unit)
            if k in seen:
                raise ValueError(f"limits[{i}]: duplicate rule for scope={r.scope} match={r.match} unit={r.unit}")
            seen.add(k)
        return self


def parse_config(raw: dict[str, Any] | None) -> RateLimitConfig:
    """Validate the `ratelimit:` dict; errors become ConfigError('ratelimit.<path>: <why>')."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"ratelimit: expected a mapping, got {type(raw).__name__}")
    try:
        return RateLimitConfig.model_validate(raw)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = "ratelimit" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
            parts.append(f"{loc}: {err['msg']}")
        raise ConfigError("; ".join(parts)) from None
