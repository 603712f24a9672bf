"""Per-request metering records in SQLite, written by a background thread.

The request path only puts a tuple on a bounded queue; the writer thread batches inserts, so a
slow disk never stalls the event loop. A full queue refuses the row (counted, logged); a row SQLite
cannot take is dropped alone (counted, logged), never its batch nor the writer. `close` drains
everything accepted.

Two tables: `requests`, one row per answered call (tokens, latency, cost), and `decisions`, one
row per rate-limit decision, admitted or refused, with the units asked for and the rule that bound
a refusal: the whole demand, which `modelyard ratelimit tune --metering-db` replays.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from dataclasses import dataclass, fields
from operator import attrgetter
from pathlib import Path

from extproc.telemetry.metrics import METERING_DROPPED
from extproc.telemetry.writer_queue import next_batch

log = logging.getLogger("modelyard.metering")

_SCHEMA = """CREATE TABLE IF NOT EXISTS requests (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, model TEXT, cluster TEXT,
    channel TEXT, status INTEGER, latency_ms REAL, ttft_ms REAL, input_tokens INTEGER,
    output_tokens INTEGER, cost REAL, strategy TEXT, arm TEXT)"""
# `requests` and `tokens` are the units asked for at the decision (tokens: the estimate).
_DECISIONS_SCHEMA = """CREATE TABLE IF NOT EXISTS decisions (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, cluster TEXT, channel TEXT,
    model TEXT, allowed INTEGER NOT NULL, requests INTEGER NOT NULL, tokens INTEGER NOT NULL,
    limited_by TEXT, rule TEXT, store TEXT)"""


@dataclass(frozen=True, slots=True)
class MeterRecord:
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


@dataclass(frozen=True, slots=True)
class DecisionRecord:
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
    store: str


class _DecisionRow(tuple):
    """A queued `decisions` row (a plain tuple is a `requests` row)."""

    __slots__ = ()


# Field values in column order, shallow: dataclasses.astuple deep-copies every value per row.
_ROW = attrgetter(*(f.name for f in fields(MeterRecord)))
_INSERT = f"INSERT INTO requests VALUES ({', '.join('?' for _ in fields(MeterRecord))})"
_DECISION = attrgetter(*(f.name for f in fields(DecisionRecord)))
_INSERT_DECISION = f"INSERT INTO decisions VALUES ({', '.join('?' for _ in fields(DecisionRecord))})"
_STOP = object()


# SQLite integers are signed 64-bit: an upstream's u64 count must not lose the row.
_INT64_MAX = 2**63 - 1
# About a minute of rows at a few thousand requests a second; beyond it the disk is not keeping up.
QUEUE_LIMIT = 200_000
_BATCH = 1000
# After the first row of a batch, wait this long for more (writer_queue.next_batch); a crash
# loses at most this much of accepted rows.
_GATHER_S = 0.02
_WARN_EVERY_S = 10.0


def _clamp(v: object) -> object:
    if type(v) is int and not -_INT64_MAX <= v <= _INT64_MAX:
        return _INT64_MAX if v > 0 else -_INT64_MAX
    return v


class MeteringStore:
    def __init__(self, path: str | Path, *, queue_limit: int = QUEUE_LIMIT):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue[tuple | object] = queue.Queue(maxsize=queue_limit)
        self._warned_at = 0.0
        self._thread = threading.Thread(target=self._run, name="metering-writer", daemon=True)
        self._thread.start()

    def record(self, rec: MeterRecord) -> bool:
        """Queue one row; False (counted, logged now and then) when the writer is too far behind."""
        return self._put(tuple(_clamp(v) for v in _ROW(rec)))

    def record_decision(self, rec: DecisionRecord) -> bool:
        """Queue one decision row, as `record`."""
        return self._put(_DecisionRow(_clamp(v) for v in _DECISION(rec)))

    def _put(self, row: tuple) -> bool:
        try:
            self._queue.put_nowait(row)
            return True
        except queue.Full:
            METERING_DROPPED.labels("queue_full").inc()
            now = time.monotonic()
            if now - self._warned_at > _WARN_EVERY_S:
                self._warned_at = now
                log.error("metering: queue full (%d rows); refusing rows until the writer catches up",
                          self._queue.maxsize)
            return False

    def _run(self) -> None:
        conn = sqlite3.connect(self.path)
        conn.execute("PRAGMA journal_mode=WAL")
        # no fsync per commit: a row survives the process crashing, not a power cut (about a
        # tenth of the extproc's CPU per request went to this thread's commits under load)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(_SCHEMA)
        conn.execute(_DECISIONS_SCHEMA)
        while True:
            batch = next_batch(self._queue, _STOP, _BATCH, _GATHER_S)
            stop = _STOP in batch
            rows = [r for r in batch if r is not _STOP]
            decisions = [r for r in rows if type(r) is _DecisionRow]
            if decisions:
                self._write(conn, _INSERT_DECISION, decisions)
            if len(decisions) < len(rows):
                self._write(conn, _INSERT, [r for r in rows if type(r) is not _DecisionRow])
            if stop:
                conn.close()
                return

    @staticmethod
    def _write(conn: sqlite3.Connection, insert: str, rows: list) -> None:
        try:
            conn.executemany(insert, rows)
            conn.commit()
            return
        except Exception:  # one bad row must not cost its batch: retry them one by one
            conn.rollback()
        for row in rows:
            try:
                conn.execute(insert, row)
            except (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.ProgrammingError, OverflowError,
                    ValueError, TypeError) as e:
                METERING_DROPPED.labels("bad_row").inc()
                log.error("metering: row for task %s dropped: %s", row[1] if len(row) > 1 else "?", e)
            except sqlite3.Error as e:  # a full disk must not take the gateway down
                METERING_DROPPED.labels("db_error").inc()
                log.error("metering: row lost: %s", e)
        try:
            conn.commit()
        except sqlite3.Error as e:
            log.error("metering: commit failed: %s", e)

    def close(self, timeout: float = 30.0) -> None:
        """Write everything accepted, then stop (SIGTERM: nothing accepted is lost)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
