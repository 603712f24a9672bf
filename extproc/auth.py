"""API keys to tenants: keys are stored as sha256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac

from extproc.config import TenantConfig


class KeyRing:
    def __init__(self, tenants: list[TenantConfig]):
        self._by_digest: dict[str, TenantConfig] = {}
        for t in tenants:
            for digest in t.api_keys:
                self._by_digest[digest] = t

    def tenant_for(self, key: str | None) -> TenantConfig | None:
        if not key:
            return None
        digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()
        tenant = self._by_digest.get(digest)
        # The dict lookup is on a digest, not the key; the final check is constant-time anyway.
        if tenant is None or not any(hmac.compare_digest(digest, d) for d in tenant.api_keys):
            return None
        return tenant
