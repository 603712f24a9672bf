"""The Gateway's key-store part: the admin API's writes (in worker threads: the event loop never
waits on the store), applied to this process's copy at once, and one audit row per admin call; and
the miss path: a key the copy does not know, looked up in the store (its own thread, a timeout,
`keys.misses.MissGate`'s bounds) before it is refused.

Other workers and replicas see a change at their next refresh (`keys.refresh_s`), or at the first
call with a key new to them (the miss path)."""

from __future__ import annotations

import asyncio
import builtins
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from console.sessions import SessionStore
from contracts.config import GatewayConfig
from contracts.errors import Unavailable
from extproc.context import RequestContext
from extproc.telemetry.audit import KEY_ADMIN, AuditEvent, AuditLog
from extproc.telemetry.metrics import (
    KEY_LOOKUPS,
    KEY_LOOKUPS_SKIPPED,
    STORE_KEYS,
    STORE_REFRESH_FAILURES,
    STORE_REFRESHED,
)
from keys.cache import KeyCache
from keys.db import StoreError, connect
from keys.misses import MissGate, Verdict
from keys.record import KeyRecord
from keys.refresher import KeyRefresher
from keys.spec import KeyChange, KeySpec
from keys.store import KeyStore

T = TypeVar("T")
log = logging.getLogger("modelyard.keys")


class KeyAdmin:
    def __init__(self, config: GatewayConfig, dsn: str, cache: KeyCache, audit: AuditLog | None) -> None:
        self.config = config
        self.dsn = dsn
        self.cache = cache
        self.audit = audit
        self.refresher = KeyRefresher(self.open_store, cache, config.keys.refresh_s, self._refreshed)
        self._store: KeyStore | None = None  # the admin API's own connection, opened at its first call
        self._sessions: SessionStore | None = None  # the console's sign-ins, beside the keys (its first page)
        self._opening = threading.Lock()
        k = config.keys
        self.misses = MissGate(per_s=k.lookups_per_s, burst=k.lookup_burst, absent_ttl_s=k.absent_ttl_s)
        # One thread of its own: a hung store holds it, not the loop's default pool (admin writes, audit).
        self._lookups = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="key-lookup")
        self._lookup_store: KeyStore | None = None  # its connection, touched only by that thread
        self._asking: dict[str, asyncio.Future[None]] = {}  # digest -> the lookup under way: one per digest

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

    async def update(self, key_id: str, change: KeyChange) -> KeyRecord:
        rec = await self._call(lambda s: s.update(key_id, change))
        self.cache.apply([rec], advance=False)
        return rec

    async def revoke(self, key_id: str) -> KeyRecord:
        rec = await self._call(lambda s: s.revoke(key_id))
        self.cache.apply([rec], advance=False)
        return rec

    async def look_up(self, digest: str) -> None:
        """Ask the store for a key this worker's copy does not know; a live one enters the copy as a
        refresh's row would (by version: a revocation the copy has seen is never undone). Raises
        Unavailable (503) when the store cannot say now: down, slow or over the lookup budget."""
        asking = self._asking.get(digest)
        if asking is None:
            verdict = self.misses.check(digest, time.monotonic())
            if verdict is not Verdict.ASK:
                KEY_LOOKUPS_SKIPPED.labels(verdict.value).inc()
                if verdict is Verdict.ABSENT:
                    return
                raise Unavailable("the key store cannot check this API key now; retry shortly", retry_after_s=1)
            asking = asyncio.ensure_future(self._ask(digest))
            self._asking[digest] = asking
            asking.add_done_callback(lambda f: self._asked(digest, f))
        await asyncio.shield(asking)  # a caller that leaves does not cancel the others' lookup

    def _asked(self, digest: str, done: asyncio.Future[None]) -> None:
        self._asking.pop(digest, None)
        if not done.cancelled():
            done.exception()  # read: a 503 whose callers all left is not "never retrieved"

    async def _ask(self, digest: str) -> None:
        loop = asyncio.get_running_loop()
        try:
            job = self._lookups.submit(self._find, digest)
        except RuntimeError:  # closing: the executor takes no more
            self.misses.settled()
            raise Unavailable("the gateway is shutting down", retry_after_s=1) from None
        # The slot frees when the thread is done, not at the timeout: pending bounds threads held.
        job.add_done_callback(lambda _: _call_soon(loop, self.misses.settled))
        try:
            rec = await asyncio.wait_for(asyncio.wrap_future(job), self.config.keys.lookup_timeout_s)
        except (StoreError, TimeoutError) as e:
            self.misses.failed(time.monotonic())
            KEY_LOOKUPS.labels("failed").inc()
            log.warning("key store lookup failed, unknown keys get 503 for now: %s", e or "timed out")
            raise Unavailable("the key store cannot be reached to check this API key; retry shortly",
                              retry_after_s=1) from None
        if rec is None or rec.revoked_at is not None:
            KEY_LOOKUPS.labels("absent").inc()
            self.misses.absent(digest, time.monotonic())
        else:
            KEY_LOOKUPS.labels("found").inc()
        if rec is not None:  # revoked too: the copy then knows it is gone
            self.cache.apply([rec], advance=False)

    def _find(self, digest: str) -> KeyRecord | None:
        """In the lookup thread: one indexed read; a broken connection is dropped, reopened next time."""
        try:
            if self._lookup_store is None:
                self._lookup_store = self.open_store()
            return self._lookup_store.by_digest(digest)
        except StoreError:
            store, self._lookup_store = self._lookup_store, None
            if store is not None:
                with contextlib.suppress(Exception):
                    store.close()
            raise

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
        self._lookups.shutdown(wait=True, cancel_futures=True)
        if self._lookup_store is not None:
            self._lookup_store.close()
            self._lookup_store = None
        if self._store is not None:
            self._store.close()
            self._store = None
        if self._sessions is not None:
            self._sessions.db.close()
            self._sessions = None

    async def _call(self, op: Callable[[KeyStore], T]) -> T:
        return await asyncio.to_thread(self._in_thread, op)

    async def sessions(self, op: Callable[[SessionStore], T]) -> T:
        """The console's sessions and spent CSRF tokens (console/sessions.py), in a worker thread; a store
        that cannot answer is a 503, as for the admin API."""
        try:
            return await asyncio.to_thread(self._in_sessions, op)
        except StoreError:
            with self._opening:  # a broken connection is dropped, reopened at the next call
                sessions, self._sessions = self._sessions, None
            if sessions is not None:
                with contextlib.suppress(Exception):
                    sessions.db.close()
            raise Unavailable("the key store cannot be reached; retry shortly", retry_after_s=1) from None

    def _in_sessions(self, op: Callable[[SessionStore], T]) -> T:
        with self._opening:
            if self._sessions is None:
                self._sessions = SessionStore(connect(self.dsn))
            sessions = self._sessions
        return op(sessions)

    def _in_thread(self, op: Callable[[KeyStore], T]) -> T:
        with self._opening:
            if self._store is None:
                self._store = self.open_store()
            store = self._store
        return op(store)


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    """From another thread: `fn` on the loop (state the loop owns), unless the loop is gone."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn)
