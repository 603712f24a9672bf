"""API keys to tenants: keys are stored as sha256 digests and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from adapters.registry import PROTOCOLS
from contracts.config import TenantConfig


class KeyRing:
    def __init__(self, tenants: list[TenantConfig]):
        self._by_digest: dict[str, TenantConfig] = {}
        self._by_name = {t.name: t for t in tenants}
        for t in tenants:
            for digest in t.api_keys:
                self._by_digest[digest] = t

    def tenant_named(self, name: str) -> TenantConfig | None:
        """A task replay's tenant, named by its marker (None once the tenant left the config)."""
        return self._by_name.get(name)

    def tenant_for(self, key: str | None) -> TenantConfig | None:
        return self.tenant_for_digest(key_digest(key) if key else None)

    def tenant_for_digest(self, digest: str | None) -> TenantConfig | None:
        """`tenant_for` of the key whose `key_digest` this is (the audit row names the key by it too)."""
        if not digest:
            return None
        tenant = self._by_digest.get(digest)
        # The dict lookup is on a digest, not the key; the final check is constant-time anyway.
        if tenant is None or not any(hmac.compare_digest(digest, d) for d in tenant.api_keys):
            return None
        return tenant


def key_digest(key: str) -> str:
    """The sha256 hex digest the config holds for `key` (`sha256:<digest>`)."""
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


def any_client_key(headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The first key found in any protocol's header (task polls: the caller may speak any of them)."""
    for adapter in PROTOCOLS.values():
        key = adapter.client_api_key(headers, query)
        if key:
            return key
    return None


def client_key(protocol: str, headers: Mapping[str, str], query: Mapping[str, str]) -> str | None:
    """The caller's API key, from its own protocol's header (or Gemini's `?key=`)."""
    adapter = PROTOCOLS.get(protocol)
    if adapter is not None:
        return adapter.client_api_key(headers, query)
    auth = headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return headers.get("x-api-key")
