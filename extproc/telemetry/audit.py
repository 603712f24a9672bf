"""The audit log: an append-only, hash-chained SQLite table of every call and security event.

The request path puts an `AuditEvent` on an unbounded queue, appends its fields to a journal file
(one `os.write`, no fsync: extproc/telemetry/journal.py) and moves on; a writer thread
redacts and caps captured bodies, chains each row to the one before (`audit_chain`) and inserts
in batches. Nothing accepted is dropped: a locked or slow disk is retried, and `close` (SIGTERM)
writes everything queued (only a row SQLite cannot bind, a bug of ours, is dropped: counted and
logged). Past `backlog_limit` rows not yet written the gateway refuses new calls (503) rather
than serve calls it cannot record. Rows a SIGKILL caught before their commit are replayed from
the journal at the next start, chained in the order they were accepted (their captured bodies are
not journaled: the caller's key is in them before redaction). Each batch reads the chain's tail inside its write
transaction, so `modelyard audit prune` (another process) can append its anchor row safely.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import orjson

from contracts.config import AuditCapture, GatewayConfig
from contracts.errors import ConfigError
from extproc.telemetry.audit_chain import (
    CHAINED_FIELDS,
    COLUMNS,
    GENESIS,
    PRUNE_EVENT,
    ChainReport,
    check_head,
    prune_anchors,
    prune_detail,
    row_hash,
    verify_chain,
)
from extproc.telemetry.journal import HEADER, Journal, first_header
from extproc.telemetry.metrics import AUDIT_BACKLOG, AUDIT_DROPPED, AUDIT_ROWS, AUDIT_WRITE_ERRORS
from extproc.telemetry.redaction import CAP_MARGIN, Redactor
from extproc.telemetry.writer_queue import next_batch

log = logging.getLogger("modelyard.audit")

_SCHEMA = """CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, event TEXT NOT NULL, task_id TEXT NOT NULL, tenant TEXT NOT NULL,
    key_id TEXT NOT NULL, client TEXT NOT NULL, method TEXT NOT NULL, path TEXT NOT NULL, model TEXT NOT NULL,
    cluster TEXT NOT NULL, status INTEGER NOT NULL, input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
    detail TEXT NOT NULL, request_body TEXT, response_body TEXT, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)"""
_INDEXES = ("CREATE INDEX IF NOT EXISTS audit_time ON audit (time)",
            "CREATE INDEX IF NOT EXISTS audit_tenant_time ON audit (tenant, time)")
_INSERT = f"INSERT INTO audit ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"
_TAIL = "SELECT id, hash FROM audit ORDER BY id DESC LIMIT 1"
# What a journal line holds (then whether the event had bodies), and what replay matches stored rows on.
_JOURNALED = ("time", "event", "task_id", "tenant", "key_id", "client", "method", "path", "model", "cluster",
              "status", "input_tokens", "output_tokens")
_STORED = f"SELECT {', '.join(_JOURNALED)} FROM audit WHERE id > ?"
_LINE = b"a"

# Calls refused (503) past this many queued rows (extproc.audit_max_queued).
BACKLOG_LIMIT = 100_000
_BATCH = 500
# After a batch's first row, wait this long for more: one commit (and fdatasync) per batch is most of
# the writer's CPU (docs/performance.md, "Issue 38, second pass": 41 -> 22 us per request at 200 ms).
_GATHER_S = 0.2
_BUSY_TIMEOUT_S = 5.0
_RETRY_S = 0.2
_WARN_EVERY_S = 10.0
_STOP = object()
# Errors that retrying cannot fix: the row itself is wrong, not the disk.
_UNBINDABLE = (sqlite3.InterfaceError, sqlite3.ProgrammingError, sqlite3.DataError, OverflowError, TypeError,
               ValueError)

CALL = "call"
AUTH_FAILURE = "auth_failure"
CONFIG_RELOAD = "config_reload"
LIMITS_CHANGE = "limits_change"
KEY_ADMIN = "key_admin"  # an admin API call on the key store (docs/keys.md)


class AuditEvent(NamedTuple):
    """One row before the writer redacts its bodies and chains it (a tuple: one per call, and a
    frozen dataclass's __init__ of 20 fields costs several times more)."""

    event: str
    time: float
    task_id: str = ""
    tenant: str = "-"
    key_id: str = ""
    client: str = ""
    method: str = ""
    path: str = ""
    model: str = ""
    cluster: str = ""
    status: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    detail: Mapping[str, object] | None = None
    # Captured bodies: a prefix of at most cap + CAP_MARGIN bytes, and each body's full size.
    request_body: bytes | None = None
    request_size: int = 0
    response_body: bytes | None = None
    response_size: int = 0
    # Exact strings to redact (the caller's key): used by the writer, never stored.
    secrets: tuple[str, ...] = ()


class AuditLog:
    def __init__(self, path: str | Path, *, captures: Mapping[str, AuditCapture] | None = None,
                 backlog_limit: int = BACKLOG_LIMIT):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.backlog_limit = backlog_limit
        self._captures = {t: c for t, c in (captures or {}).items() if c.capture_bodies}
        self._redactors = {t: Redactor(c.redact) for t, c in self._captures.items()}
        self._default_redactor = Redactor()
        self._queue: queue.SimpleQueue[AuditEvent | object] = queue.SimpleQueue()
        # Rows accepted but not yet in SQLite; each counter has one writer thread, so no lock.
        self._accepted = 0
        self._settled = 0
        self._warned_at = 0.0
        # Owner-only: rows may hold captured bodies (SQLite gives its -wal and -shm files the same mode).
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        # Schema first, on the caller's thread: a path SQLite cannot open fails the start, loudly.
        conn = _connect(self.path)
        try:
            _ensure_schema(conn)
            self._journal = Journal(self.path)
            self._replay(conn)
            self._journal.start(_header(conn))
        finally:
            conn.close()
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: GatewayConfig) -> AuditLog | None:
        if not config.extproc.audit_db:
            return None
        try:
            return cls(config.extproc.audit_db, captures={t.name: t.audit for t in config.tenants},
                       backlog_limit=config.extproc.audit_max_queued)
        except (OSError, sqlite3.Error) as e:  # refuse to start rather than serve unrecorded calls
            raise ConfigError(f"extproc.audit_db: cannot open {config.extproc.audit_db}: {e}") from None

    def set_captures(self, captures: Mapping[str, AuditCapture]) -> None:
        """A reload's body capture per tenant. The writer thread reads both maps: it never sees a
        tenant in `_captures` without its redactor (redactors first, a superset meanwhile)."""
        kept = {t: c for t, c in captures.items() if c.capture_bodies}
        redactors = {t: Redactor(c.redact) for t, c in kept.items()}
        self._redactors = {**self._redactors, **redactors}
        self._captures = kept
        self._redactors = redactors

    def capture_limit(self, tenant: str) -> int:
        """Bytes of each body to keep for this tenant's calls (0: bodies are not captured)."""
        c = self._captures.get(tenant)
        return c.max_body_bytes + CAP_MARGIN if c is not None else 0

    @property
    def pending(self) -> int:
        """Rows accepted and not yet written (queued, or in a batch the disk has not taken)."""
        return self._accepted - self._settled

    @property
    def backlogged(self) -> bool:
        return self.pending >= self.backlog_limit

    def record(self, ev: AuditEvent) -> None:
        """Queue one row; never refuses and never blocks (the loop must not wait on the disk)."""
        try:
            line: bytes | None = _LINE + orjson.dumps(
                (ev.time, ev.event, ev.task_id, ev.tenant, ev.key_id, ev.client, ev.method, ev.path, ev.model,
                 ev.cluster, ev.status, ev.input_tokens, ev.output_tokens, ev.detail,
                 ev.request_body is not None or ev.response_body is not None),
                option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # not JSON (a detail orjson cannot take): queued, not journaled
            line = None
        journal = self._journal
        with journal.lock:  # queue order is journal order, so replay chains rows as they came
            self._accepted += 1
            self._queue.put(ev)
            if line is None:
                journal.count()
            else:
                journal.append(line)
        AUDIT_BACKLOG.inc()

    def _replay(self, conn: sqlite3.Connection) -> None:
        """Chain on the journal's rows SQLite does not hold, in journal order: those after the
        segment's id mark, matched on their fields (a multiset, so two equal rows stay two)."""
        for lines in self._journal.segments():
            head = first_header(lines)
            mark = int(orjson.loads(head).get("audit", 0)) if head is not None else 0
            events = []
            for line in lines:
                if line[:1] == _LINE:
                    try:
                        *fields, detail, had_bodies = orjson.loads(line[1:])
                        ev = AuditEvent(**dict(zip(_JOURNALED, fields, strict=True)), detail=detail)
                    except (orjson.JSONDecodeError, ValueError):  # a line cut short: the disk filled
                        continue
                    if had_bodies and ev.tenant in self._captures:
                        ev = ev._replace(detail={**(detail or {}), "bodies": "lost in a crash"})
                    events.append(ev)
            if not events:
                continue
            stored = Counter(tuple(r) for r in conn.execute(_STORED, (mark,)))
            rows = []
            for ev in events:
                row = self._row(ev)
                key = tuple(row[f] for f in _JOURNALED)
                if stored[key] > 0:
                    stored[key] -= 1
                else:
                    rows.append(row)
            if rows:
                self._append(conn, rows)
            log.warning("audit: %d rows in the journal of a process that died, %d of them not committed: "
                        "now chained and stored", len(events), len(rows))

    def _row(self, ev: AuditEvent) -> dict[str, object]:
        redactor = self._redactors.get(ev.tenant, self._default_redactor)
        capture = self._captures.get(ev.tenant)  # one read: a reload may swap the map meanwhile
        cap = capture.max_body_bytes if capture is not None else 0

        def body(raw: bytes | None, size: int) -> str | None:
            return None if raw is None or not cap else redactor.capture(raw, cap, total=size, secrets=ev.secrets)

        return {"time": ev.time, "event": ev.event, "task_id": ev.task_id, "tenant": ev.tenant,
                "key_id": ev.key_id, "client": ev.client, "method": ev.method, "path": ev.path, "model": ev.model,
                "cluster": ev.cluster, "status": ev.status, "input_tokens": _int64(ev.input_tokens), "output_tokens": _int64(ev.output_tokens),
                "detail": orjson.dumps(ev.detail, option=orjson.OPT_SORT_KEYS).decode() if ev.detail else "",
                "request_body": body(ev.request_body, ev.request_size),
                "response_body": body(ev.response_body, ev.response_size)}

    def _run(self) -> None:
        conn = _connect(self.path)
        while True:
            batch = next_batch(self._queue, _STOP, _BATCH, _GATHER_S)
            stop = _STOP in batch
            rows = []
            for ev in batch:
                if isinstance(ev, AuditEvent):
                    try:
                        rows.append(self._row(ev))
                    except Exception:  # a row we cannot render is a bug: say so, keep the writer alive
                        log.exception("audit: cannot render a %s row for task %s", ev.event, ev.task_id)
            self._append(conn, rows)
            self._settled += len(batch) - stop
            AUDIT_BACKLOG.dec(len(batch) - stop)
            self._journal.settle(len(batch) - stop, lambda: _header(conn))
            if stop:
                conn.close()
                self._journal.close()
                return

    def _append(self, conn: sqlite3.Connection, rows: list[dict[str, object]]) -> None:
        """Chain and insert one batch in one transaction; a locked or failing disk is retried,
        never skipped: the rows stay in memory until SQLite takes them."""
        failed = False
        while rows:
            try:
                append_rows(conn, rows)
                AUDIT_ROWS.inc(len(rows))
                if failed:
                    log.warning("audit: writes resumed; %d rows held meanwhile are stored, %d still queued",
                                len(rows), self.pending - len(rows))
                return
            except _UNBINDABLE as e:  # a bug of ours in one row must not hold up every other row
                if len(rows) > 1:
                    for row in rows:
                        self._append(conn, [row])
                    return
                AUDIT_DROPPED.inc()
                log.error("audit: a %s row for task %s cannot be stored: %s", rows[0]["event"], rows[0]["task_id"], e)
                return
            except sqlite3.Error as e:
                failed = True
                AUDIT_WRITE_ERRORS.inc()
                now = time.monotonic()
                if now - self._warned_at > _WARN_EVERY_S:
                    self._warned_at = now
                    log.error("audit: cannot write %d rows yet (%s); holding them and %d queued in memory "
                              "(calls are refused past %d), retrying", len(rows), e, self.pending - len(rows),
                              self.backlog_limit)
                time.sleep(_RETRY_S)

    def close(self, timeout: float = 60.0) -> None:
        """Write everything queued, then stop (SIGTERM: nothing accepted is lost)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.error("audit: %d rows still unwritten after %.0fs; the disk is not taking them",
                      self.pending, timeout)


def _int64(v: int) -> int:
    """SQLite integers are signed 64-bit: an upstream's u64 count must not cost the row."""
    return max(-(2**63 - 1), min(v, 2**63 - 1))


def _connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    if readonly:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=_BUSY_TIMEOUT_S)
    else:
        # Autocommit: transactions are explicit (BEGIN IMMEDIATE), so the tail read and the
        # inserts hold one write lock together.
        conn = sqlite3.connect(path, timeout=_BUSY_TIMEOUT_S, isolation_level=None)
    conn.row_factory = sqlite3.Row
    return conn


def _header(conn: sqlite3.Connection) -> bytes:
    """A journal segment's first line: the highest id before any of its rows."""
    top = conn.execute("SELECT COALESCE(MAX(id), 0) FROM audit").fetchone()[0]
    return HEADER + orjson.dumps({"audit": top}, option=orjson.OPT_APPEND_NEWLINE)


def _ensure_schema(conn: sqlite3.Connection) -> None:
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(_SCHEMA)
    for stmt in _INDEXES:
        conn.execute(stmt)


def append_rows(conn: sqlite3.Connection, rows: list[dict[str, object]]) -> None:
    """Chain `rows` onto the table's tail and insert them, all in one write transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        _chain_insert(conn, rows, conn.execute(_TAIL).fetchone())
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _chain_insert(conn: sqlite3.Connection, rows: list[dict[str, object]], tail: sqlite3.Row | None) -> None:
    last_id, prev = (int(tail["id"]), str(tail["hash"])) if tail is not None else (0, GENESIS)
    values = []
    for r in rows:
        last_id += 1
        row = {**r, "id": last_id}
        h = row_hash(prev, row)
        values.append((*(row[f] for f in CHAINED_FIELDS), prev, h))
        prev = h
    conn.executemany(_INSERT, values)


# ---------------------------------------------------------------- offline: `modelyard audit ...`

def verify(path: str | Path, *, expect_head: str | None = None) -> ChainReport:
    """Walk the chain; with `expect_head` (`<id>:<hash>` from an earlier verify) also catch a
    removed tail, which a chain alone cannot show."""
    conn = _open_existing(path)
    try:
        anchors = prune_anchors(conn.execute("SELECT detail FROM audit WHERE event = ?", (PRUNE_EVENT,)))
        report = verify_chain(conn.execute(f"SELECT {', '.join(COLUMNS)} FROM audit ORDER BY id"), anchors)
        if report.broken is None and expect_head is not None:

            def hash_of(rid: int) -> str | None:
                row = conn.execute("SELECT hash FROM audit WHERE id = ?", (rid,)).fetchone()
                return str(row[0]) if row else None

            broken = check_head(report, expect_head, hash_of)
            if broken is not None:
                report = dataclasses.replace(report, broken=broken)
        return report
    finally:
        conn.close()


def export(path: str | Path, *, since: float | None = None, tenant: str | None = None,
           event: str | None = None) -> Iterator[bytes]:
    """Matching rows as JSON lines, oldest first, with an ISO time beside the epoch one."""
    where, args = [], []
    for clause, value in (("time >= ?", since), ("tenant = ?", tenant), ("event = ?", event)):
        if value is not None:
            where.append(clause)
            args.append(value)
    sql = f"SELECT {', '.join(COLUMNS)} FROM audit"
    if where:
        sql += " WHERE " + " AND ".join(where)
    conn = _open_existing(path)
    try:
        for r in conn.execute(sql + " ORDER BY id", args):
            row = dict(r)
            row["time_iso"] = datetime.fromtimestamp(float(row["time"]), UTC).isoformat()
            yield orjson.dumps(row) + b"\n"
    finally:
        conn.close()


@dataclass(frozen=True)
class PruneResult:
    pruned_rows: int
    first_kept_id: int | None
    anchor_hash: str | None


def prune(path: str | Path, older_than: float, *, now: float | None = None) -> PruneResult:
    """Remove the oldest rows, all of them older than `older_than` (epoch seconds), and append a
    `prune` row naming the first kept id and the hash the removed prefix ended with."""
    conn = _open_existing(path, write=True)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = _prune_locked(conn, older_than, time.time() if now is None else now)
            conn.execute("COMMIT")
            return result
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    finally:
        conn.close()


def _prune_locked(conn: sqlite3.Connection, older_than: float, now: float) -> PruneResult:
    tail = conn.execute(_TAIL).fetchone()
    if tail is None:
        return PruneResult(0, None, None)
    first_new = conn.execute("SELECT MIN(id) FROM audit WHERE time >= ?", (older_than,)).fetchone()[0]
    keep_from = int(first_new) if first_new is not None else int(tail["id"]) + 1
    count, last_cut = conn.execute("SELECT COUNT(*), MAX(id) FROM audit WHERE id < ?", (keep_from,)).fetchone()
    if not count:
        return PruneResult(0, None, None)
    anchor = str(conn.execute("SELECT hash FROM audit WHERE id = ?", (last_cut,)).fetchone()[0])
    conn.execute("DELETE FROM audit WHERE id < ?", (keep_from,))
    # The anchor row goes on the tail read before the delete: when every row was old, it is the
    # first kept row itself (id keep_from, prev_hash the anchor), and the chain still checks.
    _chain_insert(conn, [{
        "time": now, "event": PRUNE_EVENT, "task_id": "", "tenant": "-", "key_id": "", "client": "", "method": "",
        "path": "", "model": "", "cluster": "", "status": 0, "input_tokens": 0, "output_tokens": 0,
        "detail": orjson.dumps(prune_detail(keep_from, anchor, int(count), older_than),
                               option=orjson.OPT_SORT_KEYS).decode(),
        "request_body": None, "response_body": None}], tail)
    return PruneResult(int(count), keep_from, anchor)


def _open_existing(path: str | Path, *, write: bool = False) -> sqlite3.Connection:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no audit database at {p}")
    return _connect(p, readonly=not write)
