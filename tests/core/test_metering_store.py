"""The metering writer survives bad rows, bounds its queue, and drains on close."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from extproc.telemetry.metering import MeteringStore, MeterRecord
from extproc.telemetry.metrics import METERING_DROPPED


def _rec(task: str, tokens: int = 10, **kw: object) -> MeterRecord:
    base = dict(ts=1.0, task_id=task, tenant="t", tier="L1", model="m", cluster="c", channel="standard",
                status=200, latency_ms=1.0, ttft_ms=None, input_tokens=tokens, output_tokens=tokens, cost=0.0,
                strategy="", arm="")
    base.update(kw)
    return MeterRecord(**base)  # type: ignore[arg-type]


def _rows(path: Path) -> dict[str, tuple]:
    with sqlite3.connect(path) as conn:
        return {r[1]: r for r in conn.execute("SELECT * FROM requests")}


def test_a_u64_token_count_is_clamped_and_an_unbindable_row_dropped_alone(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    store = MeteringStore(db)
    before = METERING_DROPPED.labels("bad_row")._value.get()
    store.record(_rec("a"))
    store.record(_rec("huge", tokens=2**64 - 1))
    store.record(_rec("bad", strategy={"not": "bindable"}))  # type: ignore[arg-type]
    store.record(_rec("b"))
    store.close()
    rows = _rows(db)
    assert set(rows) == {"a", "huge", "b"}
    assert rows["huge"][10] == 2**63 - 1
    assert METERING_DROPPED.labels("bad_row")._value.get() == before + 1


def test_a_full_queue_refuses_rows_without_blocking_and_close_writes_every_accepted_one(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    db = tmp_path / "m.sqlite"
    gate = threading.Event()
    real_write = MeteringStore._write

    def slow_write(conn, insert, rows):  # the disk stalls until the test lets it go
        gate.wait(10)
        real_write(conn, insert, rows)

    monkeypatch.setattr(MeteringStore, "_write", staticmethod(slow_write))
    store = MeteringStore(db, queue_limit=5)
    accepted = [i for i in range(20) if store.record(_rec(f"r{i}"))]
    assert 5 <= len(accepted) < 20  # bounded: the rest were refused at once
    gate.set()
    store.close()
    assert set(_rows(db)) == {f"r{i}" for i in accepted}

