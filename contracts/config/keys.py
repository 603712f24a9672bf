"""Keys as data and budgets: where the key store lives, who may call the admin API, and what a
budget caps. The config model only; the store is `keys/`, enforcement is on the request path."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Period = Literal["day", "week", "month"]


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    usd: float = Field(ge=0)  # spend cap over one period, in the configured model prices' unit
    period: Period = "month"
    # A share of `usd` past which a metric and the webhook say the budget is nearly spent.
    soft_share: float = Field(default=0.8, gt=0, le=1)


class KeysConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    # sqlite:///path (relative paths under the run dir) or postgresql://user@host:port/db; None: run/keys.db.
    store: str | None = None
    # sha256 hex digests of the admin API keys (`modelyard hash-key`); none: the admin API is off.
    admin_keys: list[str] = Field(default_factory=list)
    refresh_s: float = Field(default=0.5, gt=0)  # how often every worker re-reads changed keys
    # A key the worker's copy does not know (created since its last refresh) is looked up in the store:
    # at most lookup_burst at once and lookups_per_s after, each within lookup_timeout_s; a digest
    # found absent is not looked up again for absent_ttl_s (docs/keys.md).
    lookups_per_s: float = Field(default=20.0, gt=0)
    lookup_burst: int = Field(default=50, ge=1)
    lookup_timeout_s: float = Field(default=1.0, gt=0)
    absent_ttl_s: float = Field(default=60.0, ge=0)
    budget_webhook: str | None = None  # POSTed once per key or tenant and period when the soft share is passed

    @field_validator("store")
    @classmethod
    def _dsn(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("expected sqlite:///PATH or postgresql://user@host:port/db")
        return v

    @field_validator("admin_keys")
    @classmethod
    def _hashed(cls, v: list[str]) -> list[str]:
        return sha256_digests(v, "admin_keys")


def sha256_digests(keys: list[str], field: str) -> list[str]:
    """Config keys as bare sha256 hex digests (`sha256:` prefix dropped); plaintext is refused."""
    out = []
    for k in keys:
        digest = k.removeprefix("sha256:")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"{field} hold sha256 hex digests (use `modelyard hash-key`)")
        out.append(digest)
    return out
