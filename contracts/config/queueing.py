"""A deployment's concurrency limit and the queue in front of it (`max_inflight`, `queue:`),
and dedicated pools (`reserved_for:`). Parsed as part of `Deployment` in contracts.config."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contracts.config.service_levels import Tier

TIERS: tuple[Tier, ...] = ("L1", "L2", "L3")
_DEFAULT_BOUND = 64
# Lower tiers give up sooner: they are the ones that wait behind everyone else.
_DEFAULT_MAX_WAIT_S: dict[Tier, float] = {"L1": 30.0, "L2": 20.0, "L3": 10.0}


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _per_tier(v: Any) -> Any:
    # A single value applies to every tier; a mapping overrides only the tiers it names.
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return dict.fromkeys(TIERS, v)
    return v


class QueueSettings(_Model):
    """Requests past `max_inflight` wait here, L1 before L2 before L3, fair across tenants.

    `bound`: most requests of a tier waiting at once (past it: 503 + retry-after, capacity).
    `max_wait_s`: longest a request of a tier waits for a slot (then: 503 + retry-after).
    `tenant_share`: the fraction of its tier's bound one tenant may hold (past it: 429, its own share).
    """

    bound: dict[Tier, int] = Field(default_factory=lambda: dict.fromkeys(TIERS, _DEFAULT_BOUND))
    max_wait_s: dict[Tier, float] = Field(default_factory=lambda: dict(_DEFAULT_MAX_WAIT_S))
    tenant_share: float = Field(0.5, gt=0, le=1)

    @field_validator("bound", "max_wait_s", mode="before")
    @classmethod
    def _expand(cls, v: Any) -> Any:
        return _per_tier(v)

    @field_validator("bound")
    @classmethod
    def _bounds(cls, v: dict[Tier, int]) -> dict[Tier, int]:
        if any(n < 0 for n in v.values()):
            raise ValueError("a queue bound is 0 (no queue) or more")
        return {**dict.fromkeys(TIERS, _DEFAULT_BOUND), **v}

    @field_validator("max_wait_s")
    @classmethod
    def _waits(cls, v: dict[Tier, float]) -> dict[Tier, float]:
        if any(s <= 0 for s in v.values()):
            raise ValueError("a max wait is more than 0 seconds")
        return {**_DEFAULT_MAX_WAIT_S, **v}

    def tenant_cap(self, tier: Tier) -> int:
        """How many requests of one tenant may wait in `tier` (at least one, when the tier queues at all)."""
        bound = self.bound[tier]
        return min(bound, max(1, int(bound * self.tenant_share))) if bound else 0


class DedicatedPool(_Model):
    """A deployment reserved for these tiers and/or tenants; nobody else is routed there."""

    tiers: list[Tier] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _someone(self) -> DedicatedPool:
        if not self.tiers and not self.tenants:
            raise ValueError("reserved_for names at least one tier or tenant")
        return self

    def admits(self, tenant: str, tier: Tier) -> bool:
        return tier in self.tiers or tenant in self.tenants
