"""API keys to callers: config-file keys first, then the key store's (an in-memory copy a
background thread keeps current; a key it does not know yet is looked up in the store, `look_up`).
Keys are looked up by sha256 digest and compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, Protocol

from adapters.registry import PROTOCOLS
from contracts.config import TenantConfig
from contracts.keys import Caller
from keys.cache import KeyCache
from keys.record import KeyRecord


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a key says is calling: the tenant as the request path sees it (a store key's model list
    already narrowed into `allowed_models`), and the `Caller` budgets and metering read."""

    tenant: TenantConfig
    caller: Caller


class _Expired:
    """A store key past its expiry: 401, said as such."""


EXPIRED: Final = _Expired()


class StoreLookup(Protocol):
    """Asks the store about a digest the cache does not hold and, found, puts it in the cache
    (extproc/key_admin.py); raises Unavailable when the store cannot say."""

    async def look_up(self, digest: str) -> None: ...


class KeyRing:
    def __init__(self, tenants: list[TenantConfig], store: KeyCache | None = None,
                 lookup: StoreLookup | None = None):
        self._by_digest: dict[str, TenantConfig] = {}
        self._by_name = {t.name: t for t in tenants}
        self._config_callers = {t.name: Identity(t, Caller(t.name, None)) for t in tenants}
        self.store = store
        self.lookup = lookup
        # A store key's view of its tenant, made once per key version (the scheduler caches by identity).
        self._narrowed: dict[str, tuple[KeyRecord, TenantConfig, Identity]] = {}
        for t in tenants:
            for digest in t.api_keys:
                self._by_digest[digest] = t

    def identity_named(self, name: str) -> Identity | None:
        """A task replay's caller, its tenant named by its marker, as a config-file key would be (the
        marker names no key); None once the tenant left the config."""
        return self._config_callers.get(name)

    async def identify_at_once(self, digest: str | None) -> Identity | _Expired | None:
        """`identify_digest`, then the store for a key this worker's copy does not know yet: a key
        works on its first call, whichever worker or entry point takes it."""
        found = self.identify_digest(digest)
        if found is None and digest is not None:
            found = await self.look_up(digest)
        return found

    def identify(self, key: str | None, now: float | None = None) -> Identity | _Expired | None:
        """The caller behind `key`; EXPIRED for a store key past its expiry; None for no such key."""
        return self.identify_digest(key_digest(key) if key else None, now)

    def identify_digest(self, digest: str | None, now: float | None = None) -> Identity | _Expired | None:
        """`identify` of the key whose `key_digest` this is (the audit row names the key by it too)."""
        if not digest:
            return None
        tenant = self._by_digest.get(digest)
        if tenant is not None:
            # The dict lookup is on a digest, not the key; the final check is constant-time anyway.
            if any(hmac.compare_digest(digest, d) for d in tenant.api_keys):
                return self._config_callers[tenant.name]
            return None
        if self.store is None:
            return None
        rec = self.store.lookup(digest)
        if rec is None:
            return None
        if rec.expired(now):
            return EXPIRED
        return self._store_identity(rec)

    async def look_up(self, digest: str | None, now: float | None = None) -> Identity | _Expired | None:
        """`identify_digest` for a digest it found nothing for: a store key this worker's copy does not
        know yet (created since its last refresh) is asked of the store, and read back through the copy,
        so the copy's versions decide (a revocation it has seen wins). None when it is no key."""
        if (not digest or self.lookup is None or self.store is None or digest in self._by_digest
                or self.store.lookup(digest) is not None):  # known here (and refused): nothing to ask
            return None
        if not self.store.loaded:  # never read here: config-file keys only until it is (no 503 for a store-less host)
            return None
        await self.lookup.look_up(digest)
        return self.identify_digest(digest, now)

    def _store_identity(self, rec: KeyRecord) -> Identity | None:
        tenant = self._by_name.get(rec.tenant)
        if tenant is None:  # the tenant left the config: its keys stop with it
            return None
        memo = self._narrowed.get(rec.id)
        if memo is not None and memo[0] is rec and memo[1] is tenant:
            return memo[2]
        view = tenant
        if rec.models is not None:
            allowed = list(rec.models) if "*" in tenant.allowed_models else [
                m for m in rec.models if m in tenant.allowed_models]
            # The tenant narrowed: every check downstream (model lists, routing, 404s) sees only these.
            view = tenant.model_copy(update={"allowed_models": allowed})
        identity = Identity(view, Caller(tenant=tenant.name, key_id=rec.id, models=None if rec.models is None else frozenset(rec.models),
                                         expires_at=rec.expires_at, budget=rec.budget, rpm=rec.rpm, tpm=rec.tpm))
        if len(self._narrowed) > 100_000:
            self._narrowed.clear()
        self._narrowed[rec.id] = (rec, tenant, identity)
        return identity


class AdminKeys:
    """The admin API's keys (`keys.admin_keys`, sha256 digests); every digest is compared, in
    constant time, so timing says nothing about which one nearly matched."""

    def __init__(self, digests: list[str]) -> None:
        self._digests = [d.removeprefix("sha256:").lower() for d in digests]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, key: str | None) -> str | None:
        """The key's digest when it is an admin key, else None."""
        if not key or not self._digests:
            return None
        digest = hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()
        hits = [hmac.compare_digest(digest, d) for d in self._digests]
        return digest if any(hits) else None


    def check_digest(self, digest: str) -> str | None:
        """A digest a console session holds, still configured? (An admin key removed ends its sessions.)"""
        hits = [hmac.compare_digest(digest, d) for d in self._digests]
        return digest if any(hits) else None


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


def caller_protocol(headers: Mapping[str, str], query: Mapping[str, str]) -> Literal["gemini", "anthropic"] | None:
    """On a path any protocol may call (`/v1/models`, task polls), the protocol the caller speaks if not
    the path's: Gemini's by its key's header (or `?key=`), Anthropic's by its version header; the answer
    and its errors take that shape."""
    if PROTOCOLS["gemini"].client_api_key(headers, query):
        return "gemini"
    if "anthropic-version" in headers:
        return "anthropic"
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
