"""`max_inflight` across the extproc workers of one host: slot counts in a memory-mapped file.

One row per (deployment, worker): the worker's pid and the slots it holds. A worker takes a slot
only while the sum over the rows is below the deployment's `max_inflight`, under one `fcntl` lock
(held for microseconds; no I/O), so the bound holds across workers exactly. Crash-safe: a worker
that starts (or restarts) in a row zeroes it, and when the sum says full, rows whose pid is gone
are zeroed first, so a killed worker's slots come back instead of leaking.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

MAGIC = b"MYSLT001"
_HEADER = struct.Struct("<8sQQ")  # magic, deployments, workers per deployment
HEADER_SIZE = 64
_ROW = struct.Struct("<qq")  # pid, slots held
MAX_WORKERS = 64  # extproc.workers' bound


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HostSlots:
    """This worker's view of the host's slot table: `take` and `give` per deployment."""

    def __init__(self, path: str | os.PathLike[str], clusters: Iterable[str], worker: int,
                 holding: Mapping[str, int] | None = None) -> None:
        """`holding`: slots this worker already holds (a reload moved it to this table with them)."""
        self.path = Path(path)
        self._index = {name: i for i, name in enumerate(sorted(clusters))}
        n = len(self._index)
        if not 0 <= worker < MAX_WORKERS:
            raise ValueError(f"worker {worker} out of range")
        self.worker = worker
        self.pid = os.getpid()
        size = HEADER_SIZE + max(1, n) * MAX_WORKERS * _ROW.size
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                if os.fstat(self._fd).st_size == 0:
                    os.ftruncate(self._fd, size)
                    os.pwrite(self._fd, _HEADER.pack(MAGIC, n, MAX_WORKERS), 0)
                magic, have, per = _HEADER.unpack(os.pread(self._fd, _HEADER.size, 0))
                if magic != MAGIC or have != n or per != MAX_WORKERS or os.fstat(self._fd).st_size != size:
                    raise ValueError(f"{self.path}: not a slot table for these {n} deployments")
                self._mm = mmap.mmap(self._fd, size)
                held = holding or {}
                for name, i in self._index.items():  # what this worker holds, whatever a predecessor left
                    _ROW.pack_into(self._mm, self._row(i, worker), self.pid, held.get(name, 0))
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
        except BaseException:
            os.close(self._fd)
            raise

    def __contains__(self, cluster: str) -> bool:
        return cluster in self._index

    @staticmethod
    def _row(i: int, worker: int) -> int:
        return HEADER_SIZE + (i * MAX_WORKERS + worker) * _ROW.size

    def _total(self, i: int, reap: bool) -> int:
        total = 0
        for w in range(MAX_WORKERS):
            off = self._row(i, w)
            pid, held = _ROW.unpack_from(self._mm, off)
            if held and reap and w != self.worker and not _alive(pid):
                _ROW.pack_into(self._mm, off, pid, 0)  # a dead worker's slots come back
                continue
            total += held
        return total

    def take(self, cluster: str, limit: int) -> bool:
        """One slot of `cluster` for this worker when the host holds fewer than `limit`."""
        i = self._index[cluster]
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            total = self._total(i, reap=False)
            if total >= limit:
                total = self._total(i, reap=True)
                if total >= limit:
                    return False
            off = self._row(i, self.worker)
            _, held = _ROW.unpack_from(self._mm, off)
            _ROW.pack_into(self._mm, off, self.pid, held + 1)
            return True
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def give(self, cluster: str) -> None:
        """Hand one of this worker's slots of `cluster` back."""
        i = self._index[cluster]
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            off = self._row(i, self.worker)
            _, held = _ROW.unpack_from(self._mm, off)
            _ROW.pack_into(self._mm, off, self.pid, max(0, held - 1))
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def held(self, cluster: str) -> int:
        """Slots of `cluster` held on this host now (every worker)."""
        fcntl.lockf(self._fd, fcntl.LOCK_EX)
        try:
            return self._total(self._index[cluster], reap=False)
        finally:
            fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()
            os.close(self._fd)
