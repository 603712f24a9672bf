"""The Gateway's key-store part: the admin API's writes (in worker threads: the event loop never
waits on the store), applied to this process's copy at once, and one audit row per admin call.

Other workers and replicas see a change at their next refresh (`keys.refresh_s`)."""

from __future__ import annotations

import asyncio
import builtins
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from contracts.config import GatewayConfig
from extproc.context import RequestContext
from extproc.telemetry.audit import KEY_ADMIN, AuditEvent, AuditLog
from extproc.telemetry.metrics import STORE_KEYS, STORE_REFRESH_FAILURES, STORE_REFRESHED
from keys.cache import KeyCache
from keys.db import connect
from keys.record import KeyRecord
from keys.refresher import KeyRefresher
from keys.spec import KeySpec
from keys.store import KeyStore

T = TypeVar("T")


class KeyAdmin:
    def __init__(self, config: GatewayConfig, dsn: str, cache: KeyCache, audit: AuditLog | None) -> None:
        self.config = config
        self.dsn = dsn
        self.cache = cache
        self.audit = audit
        self.refresher = KeyRefresher(self.open_store, cache, config.keys.refresh_s, self._refreshed)
        self._store: KeyStore | None = None  # the admin API's own connection, opened at its first call
        self._opening = threading.Lock()

    def _refreshed(self, ok: bool) -> None:
        """The refresher thread's word after each period, as metrics."""
        if ok:
            STORE_KEYS.set(len(self.cache))
            STORE_REFRESHED.set(time.time())
        else:
            STORE_REFRESH_FAILURES.inc()

    def open_store(self) -> KeyStore:
        return KeyStore(connect(self.dsn))

    async def create(self, spec: KeySpec) -> tuple[KeyRecord, str]:
        rec, secret = await self._call(lambda s: s.create(spec))
        self.cache.apply([rec], advance=False)  # this worker serves it now; the others at their refresh
        return rec, secret

    async def rotate(self, key_id: str) -> tuple[KeyRecord, str]:
        rec, secret = await self._call(lambda s: s.rotate(key_id))
        self.cache.apply([rec], advance=False)
        return rec, secret

    async def revoke(self, key_id: str) -> KeyRecord:
        rec = await self._call(lambda s: s.revoke(key_id))
        self.cache.apply([rec], advance=False)
        return rec

    async def get(self, key_id: str) -> KeyRecord:
        return await self._call(lambda s: s.get(key_id))

    async def list(self, tenant: str | None) -> builtins.list[KeyRecord]:
        return await self._call(lambda s: s.list(tenant))

    def audited(self, ctx: RequestContext, op: str, status: int, *, key_id: str = "", tenant: str = "-",
                reason: str = "") -> None:
        """One row per admin call: which admin key (its digest's prefix), what, on which key; never a secret."""
        if self.audit is None:
            return
        detail: dict[str, object] = {"op": op}
        if key_id:
            detail["key"] = key_id
        if reason:
            detail["reason"] = reason[:300]
        self.audit.record(AuditEvent(event=KEY_ADMIN, time=time.time(), task_id=ctx.task_id, tenant=tenant,
                                     key_id=ctx.admin[:12], client=ctx.client, method=ctx.method, path=ctx.path,
                                     status=status, detail=detail))

    async def close(self) -> None:
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        self.refresher.stop()
        if self._store is not None:
            self._store.close()
            self._store = None

    async def _call(self, op: Callable[[KeyStore], T]) -> T:
        return await asyncio.to_thread(self._in_thread, op)

    def _in_thread(self, op: Callable[[KeyStore], T]) -> T:
        with self._opening:
            if self._store is None:
                self._store = self.open_store()
            store = self._store
        return op(store)
