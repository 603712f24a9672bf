"""Who a request's key says is calling: shared by the key store, the auth step and budgets."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.config.keys import Budget


@dataclass(frozen=True, slots=True)
class Caller:
    tenant: str
    key_id: str | None  # the store's key id; None for a key from the config file
    models: frozenset[str] | None = None  # None: the tenant's own allowed models
    expires_at: float | None = None  # unix seconds; None: never
    budget: Budget | None = None  # the key's own budget (the tenant's is on TenantConfig)
    rpm: int | None = None  # the key's own requests per minute (a bucket beside its tenant's); None: none
    tpm: int | None = None  # the key's own tokens per minute, charged as the tenant's token buckets are
