"""A stored key as the store returns it, and its public view (never the secret, never the digest)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from contracts.config.keys import Budget


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    tenant: str
    digest: str  # sha256 hex of the secret
    name: str
    models: tuple[str, ...] | None  # None: the tenant's own allowed models
    expires_at: float | None  # unix seconds
    budget_usd: float | None
    budget_period: str | None
    created_at: float
    revoked_at: float | None
    updated_at: float
    version: int  # store-wide change counter: a refresh reads rows above the last it saw
    rpm: int | None = None  # the key's own requests per minute (None: only its tenant's limits)
    tpm: int | None = None  # the key's own tokens per minute

    @property
    def budget(self) -> Budget | None:
        if self.budget_usd is None:
            return None
        return Budget(usd=self.budget_usd, period=self.budget_period or "month")

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at

    def status(self, now: float | None = None) -> str:
        if self.revoked_at is not None:
            return "revoked"
        return "expired" if self.expired(now) else "active"

    def view(self) -> dict[str, Any]:
        """What `keys list` and the admin API show. `hash_prefix` is the audit log's `key_id` for
        this key's calls (the first 12 hex digits of its sha256)."""
        return {"id": self.id, "tenant": self.tenant, "name": self.name, "status": self.status(),
                "models": list(self.models) if self.models is not None else None,
                "expires_at": iso(self.expires_at), "budget_usd": self.budget_usd,
                "budget_period": self.budget_period if self.budget_usd is not None else None,
                "created_at": iso(self.created_at), "revoked_at": iso(self.revoked_at),
                "updated_at": iso(self.updated_at), "hash_prefix": self.digest[:12], "rpm": self.rpm,
                "tpm": self.tpm}


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
