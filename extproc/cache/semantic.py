"""The process's semantic index: the store's vectors in a `VectorIndex`, rebuilt at start from the
store and refreshed in the background (what another worker or replica stored reaches this one
within `refresh_s`; what this process stores is indexed at once).

Every change to the index (adds, removals, expiry) runs in one worker thread, the index's single
writer, so a rebuild of many rows never holds the event loop; a large partition's search runs in
that thread too (NumPy releases the GIL), a small one inline on the loop (cheaper than the hop;
`VectorIndex` is safe to read beside its writer).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from extproc.cache.lookup import ResponseLookup, VectorRow
from extproc.cache.metrics import INDEX_ROWS
from extproc.cache.vector_index import Match, VectorIndex

log = logging.getLogger("modelyard.rcache")

# Rows x dimension up to which a search runs on the loop: ~64k multiply-adds, tens of microseconds
# (bench/bench_semantic.py: 2,000 x 32 at 0.01 ms), less than a thread hop's wake-up.
INLINE_WORK = 65_536


class SemanticIndex:
    def __init__(self, store: ResponseLookup, max_rows: int = 20_000, refresh_s: float = 1.0) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.index = VectorIndex(max_rows)
        self._cursor: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rcache-search")
        # Writes submitted (counted on the loop) and done (counted in the thread): each counter has one writer.
        self._submitted = self._done = 0
        self.loaded = asyncio.Event()

    def start(self) -> None:
        """The rebuild and then the refresh loop, in the background (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a store away: the index keeps what it has; the next round tries again
                log.warning("semantic cache: index refresh failed (%s)", type(e).__name__)
            self.loaded.set()
            await asyncio.sleep(self.refresh_s)

    async def refresh(self) -> int:
        """Read what the store holds past the cursor into the index; how many rows were new."""
        now = time.time()
        loop = asyncio.get_running_loop()
        added = 0
        while True:  # until the cursor stops moving: a store hands out batches
            before = self._cursor
            rows, self._cursor = await self.store.vectors_since(before, now)
            if rows:
                added += await loop.run_in_executor(self._pool, self._add_rows, rows)
            if self._cursor == before:
                break
        await loop.run_in_executor(self._pool, self.index.expire, now)
        INDEX_ROWS.set(len(self.index))
        return added

    def _add_rows(self, rows: list[VectorRow]) -> int:
        added = 0
        for r in rows:
            if self.index.expires_of(r.key) == r.expires_at:
                continue  # this process's own put, indexed when it was made
            added += self.index.add(r.partition, r.key, np.frombuffer(r.vector, np.float32), r.expires_at)
        return added

    async def nearest(self, partition: str, vec: np.ndarray, now: float) -> Match | None:
        # Inline only with no write of ours still queued: a search in the thread runs after them (this
        # process reads its own puts).
        if self._submitted == self._done and self.index.rows(partition) * vec.shape[0] <= INLINE_WORK:
            return self.index.search(partition, vec, now)
        return await asyncio.get_running_loop().run_in_executor(self._pool, self.index.search, partition, vec, now)

    def add(self, partition: str, key: str, vec: np.ndarray, expires_at: float) -> None:
        """Index this process's own put (in the writer thread: the caller does not wait)."""
        self._queue_write(self._add_one, partition, key, vec, expires_at)

    def _add_one(self, partition: str, key: str, vec: np.ndarray, expires_at: float) -> None:
        self.index.add(partition, key, vec, expires_at)
        INDEX_ROWS.set(len(self.index))

    def forget(self, key: str) -> None:
        """A match whose entry is gone (evicted, purged, or expired early): never matched again."""
        self._queue_write(self.index.remove, key)

    def _queue_write(self, fn: Callable[..., None], *args: Any) -> None:
        self._submitted += 1

        def run() -> None:
            try:
                fn(*args)
            finally:
                self._done += 1
        self._pool.submit(run)

    async def settled(self) -> None:
        """Until the writes submitted so far are in the index (tests)."""
        await asyncio.get_running_loop().run_in_executor(self._pool, lambda: None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._pool.shutdown(wait=False)
