"""Keeps a `KeyCache` current: a daemon thread reads the rows changed since its last read, every
`keys.refresh_s`. The event loop never waits on the store; a store that cannot be reached keeps
the last copy (revocations wait for it) and is retried each period."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from keys.cache import KeyCache
from keys.db import StoreError
from keys.store import KeyStore

log = logging.getLogger("modelyard.keys")


class KeyRefresher:
    def __init__(self, open_store: Callable[[], KeyStore], cache: KeyCache, interval_s: float,
                 on_result: Callable[[bool], None] | None = None) -> None:
        self._open = open_store
        self._on_result = on_result  # told each period whether the read succeeded (metrics)
        self.cache = cache
        self.interval_s = interval_s
        self._store: KeyStore | None = None
        self._stop = threading.Event()
        self._loaded = threading.Event()
        self._tried = threading.Event()  # the first read succeeded or failed: a start need not wait longer
        self._thread: threading.Thread | None = None
        self._failing = False

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="key-refresh", daemon=True)
        self._thread.start()

    def wait_loaded(self, timeout: float) -> bool:
        """Blocks (call it from a thread) until the first read succeeded (True) or failed (False)."""
        self._tried.wait(timeout)
        return self._loaded.is_set()

    def refresh_once(self) -> int:
        """Read what changed and apply it; the number of changed rows. Raises StoreError."""
        if self._store is None:
            self._store = self._open()
        try:
            changed = self._store.changed_since(self.cache.version)
        except StoreError:
            # Drop the connection: the next period opens a fresh one (a restarted PostgreSQL).
            store, self._store = self._store, None
            with contextlib.suppress(Exception):  # best effort: it is already broken
                store.close()
            raise
        n = self.cache.apply(changed)
        self.cache.loaded = True
        self._loaded.set()
        return n

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._store is not None:
            self._store.close()
            self._store = None

    def _run(self) -> None:
        while not self._stop.is_set():
            ok = False
            try:
                self.refresh_once()
                ok = True
                if self._failing:
                    log.info("key store reachable again; keys are current")
                    self._failing = False
            except StoreError as e:
                if not self._failing:  # once per outage, not once per period
                    log.error("key store refresh failed, serving the last keys read: %s", e)
                    self._failing = True
            except Exception:
                log.exception("key store refresh: unexpected error")
            self._tried.set()
            if self._on_result is not None:
                self._on_result(ok)
            self._stop.wait(self.interval_s)
