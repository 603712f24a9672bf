"""Buckets shared by every extproc worker of one host: a table in a memory-mapped file.

With `extproc.workers: N` and the memory backend, each worker used to hold its own buckets, so a
limit let N times its rate through. Here every worker maps the same file and decides under one
`fcntl` lock on it, so a decision over several buckets is all-or-nothing across processes exactly
as `MemoryBuckets` is within one (the same `bucket` math, the same host-wide monotonic clock).

Why this is cheap and safe on the event loop: a decision holds the lock for a few microseconds
(find the slots, settle, charge, write back; no I/O but the page cache of a RAM-backed file), so
the blocking `lockf` waits at most for another worker's few microseconds. The kernel drops a
killed process's `fcntl` lock, so a worker that dies never wedges the others.

Layout: a header, then `slots` fixed records of (16-byte key digest, level nano, settled time us).
Open addressing with linear probing over at most `PROBES` slots; an empty slot has an all-zero
digest. When every slot of a key's probe window is taken (a table near full), the slot touched
longest ago is reused: its bucket was the likeliest to have refilled to full anyway.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
from collections.abc import Callable, Sequence
from pathlib import Path

from . import bucket
from .backend import BucketView, TakeResult, monotonic_us
from .bucket import BucketState
from .rules import Charge

MAGIC = b"MYBKT001"
_HEADER = struct.Struct("<8sQ")  # magic, slot count
HEADER_SIZE = 64
_SLOT = struct.Struct("<16sqq")  # key digest, level (nano), settled at (us)
_STATE = struct.Struct("<qq")
SLOT_SIZE = _SLOT.size
DEFAULT_SLOTS = 1 << 16  # 2 MiB of table: room for tens of thousands of live buckets
PROBES = 32
_EMPTY = bytes(16)
_DIGESTS_MAX = 65_536


def _digest(key: str) -> bytes:
    d = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return d if d != _EMPTY else b"\x01" + d[1:]


class HostBuckets:
    """The memory store's interface (`take_now`, `adjust_now`, `level`) over the shared table."""

    def __init__(self, path: str | os.PathLike[str], *, slots: int = DEFAULT_SLOTS,
                 clock: Callable[[], int] = monotonic_us) -> None:
        self.path = Path(path)
        self._clock = clock
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(self._fd).st_size
                if size == 0:  # the first to open it lays it out
                    os.ftruncate(self._fd, HEADER_SIZE + slots * SLOT_SIZE)
                    os.pwrite(self._fd, _HEADER.pack(MAGIC, slots), 0)
                magic, n = _HEADER.unpack(os.pread(self._fd, _HEADER.size, 0))
                if magic != MAGIC or os.fstat(self._fd).st_size != HEADER_SIZE + n * SLOT_SIZE:
                    raise ValueError(f"{self.path}: not a bucket table")
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
            self.slots = n
            self._mm = mmap.mmap(self._fd, HEADER_SIZE + n * SLOT_SIZE)
        except BaseException:
            os.close(self._fd)
            raise
        self._digests: dict[str, bytes] = {}
        self._where: dict[bytes, int] = {}  # digest -> slot last seen at (checked before use)

    # -- slots (call with the lock held) --

    def _key(self, key: str) -> bytes:
        d = self._digests.get(key)
        if d is None:
            if len(self._digests) >= _DIGESTS_MAX:
                self._digests.clear()
                self._where.clear()
            d = self._digests[key] = _digest(key)
        return d

    def _find(self, digest: bytes, create: bool) -> int:
        """The slot offset holding `digest`; with `create`, claims one (returns -off-1 when new)."""
        mm = self._mm
        off = self._where.get(digest)
        if off is not None and mm[off:off + 16] == digest:
            return off
        start = int.from_bytes(digest[:8], "little") % self.slots
        oldest, oldest_ts = -1, 0
        for i in range(PROBES):
            o = HEADER_SIZE + ((start + i) % self.slots) * SLOT_SIZE
            d = mm[o:o + 16]
            if d == digest:
                self._where[digest] = o
                return o
            if d == _EMPTY:
                if not create:
                    return -1
                mm[o:o + 16] = digest
                self._where[digest] = o
                return -o - 1
            ts = _STATE.unpack_from(mm, o + 16)[1]
            if oldest < 0 or ts < oldest_ts:
                oldest, oldest_ts = o, ts
        if not create:
            return -1
        mm[oldest:oldest + 16] = digest
        self._where[digest] = oldest
        return -oldest - 1

    def _state(self, c: Charge, now: int) -> tuple[int, BucketState]:
        off = self._find(self._key(c.key), True)
        if off < 0:  # a new bucket starts full, as in the memory store
            off, st = -off - 1, bucket.full(c.params, now)
            _STATE.pack_into(self._mm, off + 16, st.level_nano, st.ts_us)
            return off, st
        level, ts = _STATE.unpack_from(self._mm, off + 16)
        return off, bucket.settle(BucketState(level, ts), c.params, now)

    # -- the store --

    def take_now(self, charges: Sequence[Charge], now_us: int | None = None) -> TakeResult:
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            now = self._clock() if now_us is None else now_us
            found = [self._state(c, now) for c in charges]
            allowed = all(s.level_nano >= c.cost_nano for c, (_, s) in zip(charges, found))
            views = []
            for c, (off, s) in zip(charges, found):
                if allowed:
                    level = s.level_nano - c.cost_nano
                    views.append(BucketView(c, level, 0))
                else:
                    level = s.level_nano
                    views.append(BucketView(c, level, bucket.wait_us(level, c.cost_nano, c.params)))
                _STATE.pack_into(self._mm, off + 16, level, s.ts_us)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
        return TakeResult(allowed, tuple(views))

    def adjust_now(self, items: Sequence[tuple[Charge, int]], now_us: int | None = None) -> None:
        fd = self._fd
        fcntl.lockf(fd, fcntl.LOCK_EX)
        try:
            now = self._clock() if now_us is None else now_us
            for c, delta in items:
                off, s = self._state(c, now)
                s = bucket.adjust(s, c.params, delta, now)
                _STATE.pack_into(self._mm, off + 16, s.level_nano, s.ts_us)
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)

    def level(self, key: str) -> BucketState | None:
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            off = self._find(self._key(key), False)
            if off < 0:
                return None
            return BucketState(*_STATE.unpack_from(self._mm, off + 16))
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    async def take(self, charges: Sequence[Charge]) -> TakeResult:
        return self.take_now(charges)

    async def adjust(self, items: Sequence[tuple[Charge, int]]) -> None:
        self.adjust_now(items)

    async def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
            os.close(self._fd)
