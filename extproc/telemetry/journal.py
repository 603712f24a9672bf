"""A writer thread's crash journal: every accepted row, appended to a file before SQLite has it.

The request path appends one line with one `os.write` on an O_APPEND fd (no fsync): the bytes sit
in the kernel's page cache, so they outlive the process being SIGKILLed, though not a power cut
(which the SQLite files, written without fsync, do not survive either). The writer thread truncates
the journal once every row appended so far is committed, and when that does not happen for
`ROTATE_BYTES` it starts a new segment and deletes the old one once its rows are committed. At
start the store replays what is left (idempotently: rows SQLite already holds are skipped), so a
row accepted before a SIGKILL is never lost.

Each process holds one slot, `<db>.journal.<n>` (and `.old` while rotating), by an flock on
`<db>.journal.<n>.lock`: workers and a standby sharing one database each journal apart, and a slot
whose process is dead (its lock free) is replayed by whichever process starts next.

A segment begins with a header line, `h` + JSON of each table's highest rowid when it began: a row
of that segment that did get committed has a higher rowid, which bounds replay's duplicate check.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("modelyard.journal")

HEADER = b"h"
# A segment past this size while rows stay pending is set aside and a new one started.
ROTATE_BYTES = 16 << 20
_WARN_EVERY_S = 10.0


class Journal:
    """One process's journal slot. `lock` covers a row's queue put and its `append` together, so
    queue order is journal order and the pending count is exact."""

    def __init__(self, db: Path):
        self.lock = threading.Lock()
        self._appended = 0  # rows accepted (under `lock`)
        self._settled = 0  # rows the writer is done with (committed, or dropped as unstorable)
        self._old_until: int | None = None  # rows in the `.old` segment end at this count
        self._warned_at = 0.0
        self._fd = -1
        base = f"{db}.journal"
        self._lock_fd, slot, self._orphans = _claim(base)
        self._path = f"{base}.{slot}"

    def segments(self) -> list[list[bytes]]:
        """Lines left by dead processes (ours from the last run, and any orphaned slot): one list
        per slot, oldest line first."""
        out = []
        for path in (self._path, *(p for p, _ in self._orphans)):
            lines: list[bytes] = []
            for seg in (f"{path}.old", path):
                try:
                    with open(seg, "rb") as f:
                        lines.extend(line for line in f.read().split(b"\n") if line)
                except FileNotFoundError:
                    pass
            if lines:
                out.append(lines)
        return out

    def start(self, header: bytes) -> None:
        """After replay: empty every replayed slot, release the orphans', and open our own."""
        for path, lock_fd in self._orphans:
            _drop(path)
            os.close(lock_fd)
        self._orphans = []
        _drop(self._path)
        # Owner-only, like the databases: rows may name tenants and keys' ids.
        self._fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(self._fd, header)

    def append(self, line: bytes) -> None:
        """Call with `lock` held, after the row went on the queue."""
        self._appended += 1
        try:
            os.write(self._fd, line)
        except OSError as e:  # a full disk must not fail the request; the row is still queued
            now = time.monotonic()
            if now - self._warned_at > _WARN_EVERY_S:
                self._warned_at = now
                log.error("journal %s: cannot append (%s); rows queued meanwhile are lost on a crash",
                          self._path, e)

    def count(self) -> None:
        """Call with `lock` held for a row queued without a line (one that cannot be serialized)."""
        self._appended += 1

    def settle(self, n: int, header: Callable[[], bytes]) -> None:
        """Writer thread, after `n` more rows are committed: trim what is no longer needed."""
        self._settled += n
        try:
            self._trim(header)
        except OSError as e:  # a full disk must not stop the writer: the next settle trims again
            now = time.monotonic()
            if now - self._warned_at > _WARN_EVERY_S:
                self._warned_at = now
                log.error("journal %s: cannot trim (%s); it is trimmed once the disk takes writes", self._path, e)

    def _trim(self, header: Callable[[], bytes]) -> None:
        if self._appended == self._settled:  # unlocked peek; checked again under the lock
            line = header()  # outside the lock: a query must not hold up the request path
            with self.lock:
                if self._appended == self._settled:
                    os.ftruncate(self._fd, 0)
                    os.write(self._fd, line)
                    if self._old_until is not None:
                        _unlink(f"{self._path}.old")
                        self._old_until = None
                    return
        if self._old_until is not None:
            if self._settled >= self._old_until:
                _unlink(f"{self._path}.old")
                self._old_until = None
        elif os.fstat(self._fd).st_size > ROTATE_BYTES:
            line = header()
            fd = os.open(f"{self._path}.new", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, line)
            except OSError:
                os.close(fd)
                raise
            with self.lock:
                os.rename(self._path, f"{self._path}.old")
                os.rename(f"{self._path}.new", self._path)
                old, self._fd = self._fd, fd
                self._old_until = self._appended
            os.close(old)

    def close(self) -> None:
        """After the writer drained everything (SIGTERM): nothing is pending, leave no file."""
        with self.lock:
            if self._appended == self._settled:
                _drop(self._path)
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        os.close(self._lock_fd)


def first_header(lines: list[bytes]) -> bytes | None:
    return next((line[1:] for line in lines if line[:1] == HEADER), None)


def _claim(base: str) -> tuple[int, int, list[tuple[str, int]]]:
    """Lock the first free slot; also lock every other slot with a journal and no live owner."""
    parent, name = os.path.split(base)
    pattern = re.compile(re.escape(name) + r"\.(\d+)(?:\.old|\.lock)?$")
    known = {int(m[1]) for f in os.listdir(parent or ".") if (m := pattern.match(f))}
    mine: tuple[int, int] | None = None
    orphans: list[tuple[str, int]] = []
    last = max(known, default=-1)
    for slot in itertools.count():
        if mine is not None and slot > last:
            break
        if mine is not None and slot not in known:
            continue
        fd = os.open(f"{base}.{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a live process holds it
            os.close(fd)
            continue
        if mine is None:
            mine = (fd, slot)
        else:
            orphans.append((f"{base}.{slot}", fd))
    assert mine is not None  # the loop only ends once a slot is ours
    return mine[0], mine[1], orphans


def _drop(path: str) -> None:
    _unlink(f"{path}.old")
    _unlink(f"{path}.new")
    _unlink(path)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
