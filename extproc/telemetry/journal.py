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

A segment is a file of `MAP_BYTES` written with zeros first and mapped shared: an append is a copy
into the page cache, no system call (three a request were about 8% of the extproc's CPU, and each
let go of the GIL). The zeros are real blocks, so a copy never needs the disk to find room (a full
disk cannot fault it); past the map's end, where the file cannot be made, or where the disk has
less than `MAP_ROOM` maps' worth free (a small run disk keeps its room for the databases), lines go
by `os.write` as before. Replay drops the NULs of a segment's unused tail.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import mmap
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
# A mapped segment's size; it rotates at half of it, so appends stay in the map while the writer keeps up.
# A request appends ~480 bytes (two metering rows, one audit row); at 256 KiB a writer the loop starved of
# the GIL fell behind at ~1,500 req/s in one process and 2/3 of the appends spilled to os.write.
MAP_BYTES = 1 << 20
# A segment is mapped only where the disk has this many maps' worth free: on a small run disk two
# stores' maps (and a rotation's next one) would take the room the databases need.
MAP_ROOM = 4
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
        self._seg: _Segment | None = None
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
                        lines.extend(line for raw in f.read().split(b"\n") if (line := raw.strip(b"\0")))
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
        self._seg = _Segment(self._path, header)

    def append(self, line: bytes) -> None:
        """Call with `lock` held, after the row went on the queue."""
        self._appended += 1
        seg = self._seg
        assert seg is not None
        end = seg.pos + len(line)
        if seg.map is not None and end <= MAP_BYTES:
            seg.map[seg.pos:end] = line
            seg.pos = end
            return
        try:
            seg.write(line)
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
        seg = self._seg
        assert seg is not None
        if self._appended == self._settled:  # unlocked peek; checked again under the lock
            line = header()  # outside the lock: a query must not hold up the request path
            fresh = self._remapped(line) if seg.map is None else None
            with self.lock:
                if self._appended == self._settled:
                    if fresh is None:
                        seg.reset(line)
                    else:  # the disk has room again: back to a mapped segment
                        os.rename(f"{self._path}.new", self._path)
                        self._seg = fresh
                    if self._old_until is not None:
                        _unlink(f"{self._path}.old")
                        self._old_until = None
                    if fresh is not None:
                        seg.close()
                    return
            if fresh is not None:
                fresh.close()
                _unlink(f"{self._path}.new")
        if self._old_until is not None:
            if self._settled >= self._old_until:
                _unlink(f"{self._path}.old")
                self._old_until = None
        elif seg.size() > (min(ROTATE_BYTES, MAP_BYTES // 2) if seg.map is not None else ROTATE_BYTES):
            fresh = _Segment(f"{self._path}.new", header())
            with self.lock:
                os.rename(self._path, f"{self._path}.old")
                os.rename(f"{self._path}.new", self._path)
                old, self._seg = seg, fresh
                self._old_until = self._appended
            old.close()

    def _remapped(self, header: bytes) -> _Segment | None:
        """A new mapped segment at `.new` for an unmapped one (made while the disk was full), or None."""
        if not _room_for_map(os.path.dirname(self._path) or "."):
            return None
        try:
            fresh = _Segment(f"{self._path}.new", header)
        except OSError:
            _unlink(f"{self._path}.new")
            return None
        if fresh.map is None:
            fresh.close()
            _unlink(f"{self._path}.new")
            return None
        return fresh

    def close(self) -> None:
        """After the writer drained everything (SIGTERM): nothing is pending, leave no file."""
        with self.lock:
            if self._appended == self._settled:
                _drop(self._path)
            if self._seg is not None:
                self._seg.close()
                self._seg = None
        os.close(self._lock_fd)


class _Segment:
    """One journal file: mapped (`map`, lines up to `pos`, zeros after) or, where the zeros could
    not be written, appended to by `os.write`; `spilled` once lines went past the map's end."""

    def __init__(self, path: str, header: bytes) -> None:
        # Owner-only, like the databases: rows may name tenants and keys' ids.
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o600)
        self.map: mmap.mmap | None = None
        self.spilled = False
        try:
            # Real blocks, not a hole: a copy into the map never faults on a full disk.
            if _room_for_map(self.fd) and os.write(self.fd, bytes(MAP_BYTES)) == MAP_BYTES:
                self.map = mmap.mmap(self.fd, MAP_BYTES)
        except (OSError, ValueError):  # the disk is full, or the file cannot be mapped: appends write
            self.map = None
        try:
            if self.map is None:
                os.ftruncate(self.fd, 0)
                os.write(self.fd, header)
            else:
                self.map[:len(header)] = header
        except BaseException:
            self.close()
            raise
        self.pos = self.head = len(header)

    def write(self, line: bytes) -> None:
        """A line by `os.write`: past the map's end (after its zeros, which replay drops), or unmapped."""
        if self.map is not None:
            self.spilled = True
            self.pos = MAP_BYTES  # the map takes no more lines: they stay in file order
        os.write(self.fd, line)

    def size(self) -> int:
        return self.pos if self.map is not None and not self.spilled else os.fstat(self.fd).st_size

    def reset(self, header: bytes) -> None:
        """Every line committed: the header alone. Mapped, the lines are zeroed (and any past the
        map cut off) before the header changes, so a crash between leaves the old header over
        committed rows or nothing: replay skips those."""
        if self.map is None:
            os.ftruncate(self.fd, 0)
            os.write(self.fd, header)
            return
        self.map[self.head:self.pos] = bytes(self.pos - self.head)
        if self.spilled:
            os.ftruncate(self.fd, MAP_BYTES)  # the map's own blocks stay: a later copy still cannot fault
            self.spilled = False
        width = max(len(header), self.head)
        self.map[:width] = header.ljust(width, b"\0")
        self.pos = self.head = len(header)

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
            self.map = None
        os.close(self.fd)


def _room_for_map(where: int | str) -> bool:
    """Whether the filesystem holding `where` (an fd or a directory) has room for a map to spare."""
    st = os.fstatvfs(where) if isinstance(where, int) else os.statvfs(where)
    return st.f_bavail * st.f_frsize >= MAP_ROOM * MAP_BYTES


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
