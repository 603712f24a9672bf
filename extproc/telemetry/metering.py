"""Per-request metering records in SQLite, written by a background thread.

The request path only puts a tuple on a bounded queue and appends it to a journal file (one
`os.write`, no fsync: extproc/telemetry/journal.py); the writer thread batches inserts, so a
slow disk never stalls the event loop. Rows a SIGKILL caught before their commit are replayed
from the journal at the next start. A full queue refuses the row (counted, logged); a row SQLite
cannot take is dropped alone (counted, logged), never its batch nor the writer. Rows the disk
refuses (full, I/O error) are held in memory, up to `HELD_LIMIT`, and retried every `RETRY_S`
(`modelyard_metering_rows_held`, one log line when it starts and one when writes resume); past
the bound they are dropped, counted as `held_full`. `close` drains everything accepted.

Three tables: `requests`, one row per answered call (tokens, latency, cost), `decisions`, one
row per rate-limit decision, admitted or refused, with the units asked for and the rule that bound
a refusal: the whole demand, which `modelyard ratelimit tune --metering-db` replays; and `feedback`,
the scores callers gave their calls (`POST /v1/feedback`), beside the rows they score.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import orjson

from extproc.telemetry.journal import HEADER, Journal, first_header
from extproc.telemetry.metrics import METERING_DROPPED, METERING_HELD, METERING_WRITE_ERRORS
from extproc.telemetry.writer_queue import next_batch

log = logging.getLogger("modelyard.metering")

_SCHEMA = """CREATE TABLE IF NOT EXISTS requests (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, model TEXT, cluster TEXT,
    channel TEXT, status INTEGER, latency_ms REAL, ttft_ms REAL, input_tokens INTEGER,
    output_tokens INTEGER, cost REAL, strategy TEXT, arm TEXT, key_id TEXT)"""
# `requests` and `tokens` are the units asked for at the decision (tokens: the estimate).
_DECISIONS_SCHEMA = """CREATE TABLE IF NOT EXISTS decisions (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, cluster TEXT, channel TEXT,
    model TEXT, allowed INTEGER NOT NULL, requests INTEGER NOT NULL, tokens INTEGER NOT NULL,
    limited_by TEXT, rule TEXT, store TEXT, key_id TEXT)"""
# A caller's score of one of its calls; `task_id` joins it to that call's `requests` row.
_FEEDBACK_SCHEMA = """CREATE TABLE IF NOT EXISTS feedback (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, key_id TEXT, score REAL NOT NULL, labels TEXT)"""
# Feedback finds its call's row by task id (and the A/B readout joins on it).
_TASK_INDEX = "CREATE INDEX IF NOT EXISTS requests_task_id ON requests (task_id)"
# Columns added since the first schema, last in their table: (table, column, type). `_open` adds
# them to an older file, and a journal line written before them is padded with NULLs on replay.
_ADDED_COLUMNS = (("requests", "key_id", "TEXT"), ("decisions", "key_id", "TEXT"),
                  # issue 39: the prompt cache's part of input_tokens, and what it saved (cost at the full
                  # input price minus cost); rows from before read as no cache
                  ("requests", "cache_read_tokens", "INTEGER"), ("requests", "cache_write_tokens", "INTEGER"),
                  ("requests", "cache_write_1h_tokens", "INTEGER"), ("requests", "cache_saved", "REAL"),
                  # 1: answered from the response cache (no upstream call; cost 0, cache_saved what it would cost)
                  ("requests", "response_cache_hit", "INTEGER"),
                  # issue 41: the learning strategy's probability of the arm it chose (`arm`); NULL otherwise
                  ("requests", "propensity", "REAL"))


class MeterRecord(NamedTuple):
    """One `requests` row, its values in column order (a tuple: the row itself, no copy per row)."""

    ts: float
    task_id: str
    tenant: str
    tier: str
    model: str
    cluster: str
    channel: str
    status: int
    latency_ms: float
    ttft_ms: float | None
    input_tokens: int
    output_tokens: int
    cost: float
    strategy: str
    arm: str
    key_id: str | None = None  # the key store's id of the caller's key; None for a config-file key
    cache_read_tokens: int = 0  # of input_tokens: read from the provider's prompt cache
    cache_write_tokens: int = 0  # of input_tokens: written to it, every TTL
    cache_write_1h_tokens: int = 0  # of cache_write_tokens: with a 1-hour TTL
    cache_saved: float = 0.0  # cost with every prompt token at the input price, minus cost
    response_cache_hit: int = 0  # 1: answered from the response cache (docs/cache.md)
    propensity: float | None = None  # routing.adaptive: the chosen arm's probability (route replay weighs by it)


class DecisionRecord(NamedTuple):
    """One rate-limit decision; `limited_by` (bucket key) and `rule` are empty when admitted."""

    ts: float
    task_id: str
    tenant: str
    tier: str
    cluster: str
    channel: str
    model: str
    allowed: bool
    requests: int
    tokens: int
    limited_by: str
    rule: str
    store: str  # the bucket store; "budget" for a refusal by a spent budget
    key_id: str | None = None


class FeedbackRecord(NamedTuple):
    ts: float
    task_id: str
    tenant: str
    key_id: str | None
    score: float
    labels: str | None  # a JSON object, or None


class _DecisionRow(tuple):
    """A queued `decisions` row (a plain tuple is a `requests` row)."""

    __slots__ = ()


class _FeedbackRow(tuple):
    """A queued `feedback` row."""

    __slots__ = ()


_INSERT = f"INSERT INTO requests VALUES ({', '.join('?' for _ in MeterRecord._fields)})"
_INSERT_DECISION = f"INSERT INTO decisions VALUES ({', '.join('?' for _ in DecisionRecord._fields)})"
_INSERT_FEEDBACK = f"INSERT INTO feedback VALUES ({', '.join('?' for _ in FeedbackRecord._fields)})"
_STOP = object()
# A journal line is its kind, then the row's values as a JSON array.
_REQUEST_LINE = b"r"
_DECISION_LINE = b"d"
_FEEDBACK_LINE = b"f"
_TABLES = (("requests", _REQUEST_LINE, _INSERT), ("decisions", _DECISION_LINE, _INSERT_DECISION),
           ("feedback", _FEEDBACK_LINE, _INSERT_FEEDBACK))
_WIDTH = {"requests": len(MeterRecord._fields), "decisions": len(DecisionRecord._fields),
          "feedback": len(FeedbackRecord._fields)}


# SQLite integers are signed 64-bit: an upstream's u64 count must not lose the row.
_INT64_MAX = 2**63 - 1
# About a minute of rows at a few thousand requests a second; beyond it the disk is not keeping up.
QUEUE_LIMIT = 200_000
_BATCH = 1000
# After the first row of a batch, wait this long for more (writer_queue.next_batch); rows a crash
# catches here are in the journal and replayed at the next start. 100 ms, not 20: a commit per batch
# is most of the writer's CPU (docs/performance.md, "Issue 38, second pass": 56 -> 26 us per request).
_GATHER_S = 0.1
_WARN_EVERY_S = 10.0
# Rows the disk refused, kept for a retry: half a million is about 100 MiB of tuples, minutes of
# traffic at a few thousand requests a second; a full disk lasting longer loses the newest.
HELD_LIMIT = 500_000
RETRY_S = 1.0


def _clamp(v: object) -> object:
    if type(v) is int and not -_INT64_MAX <= v <= _INT64_MAX:
        return _INT64_MAX if v > 0 else -_INT64_MAX
    return v


def _clamped(row: tuple) -> tuple:
    """`row` itself when no value needs clamping (every row but a hostile one): a plain loop, no
    new tuple."""
    for v in row:
        if type(v) is int and not -_INT64_MAX <= v <= _INT64_MAX:
            return tuple(map(_clamp, row))
    return row


class MeteringStore:
    def __init__(self, path: str | Path, *, queue_limit: int = QUEUE_LIMIT):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # SimpleQueue (C, no Condition to notify) bounded by hand: puts are serialized by the journal lock.
        self._queue: queue.SimpleQueue[tuple | object] = queue.SimpleQueue()
        self._limit = queue_limit
        self._warned_at = 0.0
        # Schema and replay on the caller's thread, before the first row: the start waits for them.
        conn = _open(self.path)
        try:
            self._journal = Journal(self.path)
            self._replay(conn)
            self._journal.start(_header(conn))
        finally:
            conn.close()
        self._held: list[tuple] = []  # writer thread only: rows the disk refused, oldest first
        self._thread = threading.Thread(target=self._run, name="metering-writer", daemon=True)
        self._thread.start()

    @property
    def held(self) -> int:
        """Rows the disk refused that wait in memory for the next retry."""
        return len(self._held)

    def record(self, rec: MeterRecord | tuple) -> bool:
        """Queue one row (a `MeterRecord`, or a plain tuple of its values in column order: the
        request path's); False (counted, logged now and then) when the writer is too far behind."""
        row = _clamped(rec if type(rec) is tuple else tuple(rec))  # orjson takes no tuple subclass
        return self._put(row, _REQUEST_LINE, row)

    def record_decision(self, rec: DecisionRecord | tuple) -> bool:
        """Queue one decision row (a `DecisionRecord` or its values), as `record`."""
        row = _clamped(rec if type(rec) is tuple else tuple(rec))
        return self._put(row, _DECISION_LINE, _DecisionRow(row))

    def record_feedback(self, rec: FeedbackRecord) -> bool:
        """Queue one feedback row, as `record`."""
        row = _clamped(tuple(rec))
        return self._put(row, _FEEDBACK_LINE, _FeedbackRow(row))

    def _put(self, row: tuple, kind: bytes, item: tuple) -> bool:
        """Queue `item` and journal `row` (its values: orjson takes no tuple subclass)."""
        try:
            line: bytes | None = kind + orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE)
        except TypeError:  # not JSON: SQLite will not take it either (the writer logs it)
            line = None
        journal = self._journal
        with journal.lock:  # queue order is journal order
            full = self._queue.qsize() >= self._limit
            if not full:
                self._queue.put(item)
                if line is None:
                    journal.count()
                else:
                    journal.append(line)
        if not full:
            return True
        METERING_DROPPED.labels("queue_full").inc()
        now = time.monotonic()
        if now - self._warned_at > _WARN_EVERY_S:
            self._warned_at = now
            log.error("metering: queue full (%d rows); refusing rows until the writer catches up",
                      self._limit)
        return False

    def _replay(self, conn: sqlite3.Connection) -> None:
        """Insert the journal's rows SQLite does not hold: those after each table's rowid mark,
        matched value for value (a multiset, so two equal rows stay two)."""
        for lines in self._journal.segments():
            head = first_header(lines)
            marks = orjson.loads(head) if head is not None else {}
            for table, kind, insert in _TABLES:
                rows = []
                for line in lines:
                    if line[:1] == kind:
                        try:
                            row = tuple(orjson.loads(line[1:]))
                        except orjson.JSONDecodeError:  # a line cut short: the disk filled
                            continue
                        if not any(isinstance(v, (list, dict)) for v in row):  # SQLite refused it before
                            # a line from before a column was added: NULL in it, as in the migrated rows
                            rows.append(row + (None,) * (_WIDTH[table] - len(row)))
                if not rows:
                    continue
                stored = Counter(tuple(r) for r in conn.execute(f"SELECT * FROM {table} WHERE rowid > ?",
                                                                 (int(marks.get(table, 0)),)))
                missing = []
                for row in rows:
                    if stored[row] > 0:
                        stored[row] -= 1
                    else:
                        missing.append(row)
                if missing:
                    self._write(conn, insert, missing)
                log.warning("metering: %d %s rows in the journal of a process that died, %d of them not "
                            "committed: now stored", len(rows), table, len(missing))

    def _run(self) -> None:
        conn = _open(self.path)
        while True:
            batch = next_batch(self._queue, _STOP, _BATCH, _GATHER_S, RETRY_S if self._held else None)
            stop = _STOP in batch
            fresh = [r for r in batch if r is not _STOP]
            rows = self._held + fresh if self._held else fresh  # held rows first: they are older
            was_held = len(self._held)
            if rows:
                self._held = self._flush(conn, rows)
                self._report_held(was_held)
            try:
                self._journal.settle(len(rows) - len(self._held), lambda: _header(conn))
            except sqlite3.Error as e:  # the header's query: the journal is trimmed next time
                log.error("metering: journal not trimmed: %s", e)
            if stop:
                if self._held:
                    log.error("metering: stopping with %d rows the disk refused; they stay in the journal "
                              "for the next start to replay", len(self._held))
                conn.close()
                self._journal.close()
                return

    def _flush(self, conn: sqlite3.Connection, rows: list) -> list:
        """Write `rows`; return those the disk refused, to hold (up to HELD_LIMIT: the oldest kept)."""
        decisions = [r for r in rows if type(r) is _DecisionRow]
        feedback = [r for r in rows if type(r) is _FeedbackRow]
        requests = [r for r in rows if type(r) is tuple] if len(decisions) + len(feedback) < len(rows) else []
        held = (self._write(conn, _INSERT_DECISION, decisions) if decisions else []) + \
            (self._write(conn, _INSERT, requests) if requests else []) + \
            (self._write(conn, _INSERT_FEEDBACK, feedback) if feedback else [])
        if len(held) > HELD_LIMIT:
            METERING_DROPPED.labels("held_full").inc(len(held) - HELD_LIMIT)
            log.error("metering: %d rows lost: the disk refuses writes and %d rows already wait in memory",
                      len(held) - HELD_LIMIT, HELD_LIMIT)
            held = held[:HELD_LIMIT]
        return held

    def _report_held(self, before: int) -> None:
        METERING_HELD.set(len(self._held))
        if self._held and not before:
            log.error("metering: the disk refuses writes; holding %d rows in memory (up to %d) and retrying "
                      "every %.0f s", len(self._held), HELD_LIMIT, RETRY_S)
        elif before and not self._held:
            log.warning("metering: writes resumed; the %d rows held meanwhile are stored", before)

    @staticmethod
    def _write(conn: sqlite3.Connection, insert: str, rows: list) -> list:
        """Insert `rows` in one transaction; one bad row is dropped alone (counted, logged). Returns
        the rows not stored because the disk refused them (full, I/O error, locked)."""
        try:
            _executemany(conn, insert, rows)
            conn.commit()
            return []
        except sqlite3.OperationalError:  # the disk's fault, not a row's: keep the batch whole
            METERING_WRITE_ERRORS.inc()
            _rollback(conn)
            return rows
        except Exception:  # one bad row must not cost its batch: retry them one by one
            _rollback(conn)
        good = []
        for row in rows:
            try:
                conn.execute(insert, row)
                good.append(row)
            except sqlite3.OperationalError:
                METERING_WRITE_ERRORS.inc()
                _rollback(conn)
                return rows  # nothing of this transaction is committed
            except (sqlite3.Error, OverflowError, ValueError, TypeError) as e:
                METERING_DROPPED.labels("bad_row").inc()
                log.error("metering: row for task %s dropped: %s", row[1] if len(row) > 1 else "?", e)
        try:
            conn.commit()
        except sqlite3.Error:
            METERING_WRITE_ERRORS.inc()
            _rollback(conn)
            return good  # the bad rows are dropped for good; the others go again
        return []

    def close(self, timeout: float = 30.0) -> None:
        """Write everything accepted, then stop (SIGTERM: nothing accepted is lost)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)


def _executemany(conn: sqlite3.Connection, insert: str, rows: list) -> None:
    conn.executemany(insert, rows)  # a seam: the unit tests refuse writes here as a full disk does


def _rollback(conn: sqlite3.Connection) -> None:
    try:
        conn.rollback()
    except sqlite3.Error as e:  # the transaction is gone either way
        log.debug("metering: rollback: %s", e)


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    # no fsync per commit: a row survives the process crashing, not a power cut (about a
    # tenth of the extproc's CPU per request went to this thread's commits under load)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(_SCHEMA)
    conn.execute(_DECISIONS_SCHEMA)
    conn.execute(_FEEDBACK_SCHEMA)
    conn.execute(_TASK_INDEX)
    _migrate(conn)
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    """Add the columns an older file lacks (workers may race to it: a duplicate is no error)."""
    for table, column, kind in _ADDED_COLUMNS:
        if column in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            conn.commit()
        except sqlite3.OperationalError as e:
            if "duplicate column" not in str(e):
                raise


def _header(conn: sqlite3.Connection) -> bytes:
    """A journal segment's first line: each table's highest rowid before any of its rows."""
    marks = {t: conn.execute(f"SELECT COALESCE(MAX(rowid), 0) FROM {t}").fetchone()[0] for t, _, _ in _TABLES}
    return HEADER + orjson.dumps(marks, option=orjson.OPT_APPEND_NEWLINE)
