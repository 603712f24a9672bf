"""Per-request metering records in SQLite, written by a background thread.

The request path only puts a tuple on a queue; the writer thread batches inserts, so a slow disk
never stalls the event loop. `modelyard ratelimit tune --metering-db` replays this table.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from dataclasses import astuple, dataclass, fields
from pathlib import Path

log = logging.getLogger("modelyard.metering")

_SCHEMA = """CREATE TABLE IF NOT EXISTS requests (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, model TEXT, cluster TEXT,
    channel TEXT, status INTEGER, latency_ms REAL, ttft_ms REAL, input_tokens INTEGER,
    output_tokens INTEGER, cost REAL, strategy TEXT, arm TEXT)"""


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


_INSERT = f"INSERT INTO requests VALUES ({', '.join('?' for _ in fields(MeterRecord))})"
_STOP = object()


class MeteringStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="metering-writer", daemon=True)
        self._thread.start()

    def record(self, rec: MeterRecord) -> None:
        self._queue.put(astuple(rec))

    def _run(self) -> None:
        conn = sqlite3.connect(self.path)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(_SCHEMA)
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty() and len(batch) < 1000:
                batch.append(self._queue.get_nowait())
            stop = _STOP in batch
            rows = [r for r in batch if r is not _STOP]
            try:
                conn.executemany(_INSERT, rows)
                conn.commit()
            except sqlite3.Error as e:  # a full disk must not take the gateway down
                log.error("metering: %d records lost: %s", len(rows), e)
            if stop:
                conn.close()
                return

    def close(self, timeout: float = 5.0) -> None:
        self._queue.put(_STOP)
        self._thread.join(timeout)
