"""The metering writer survives bad rows, bounds its queue, and drains on close."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from extproc.telemetry import journal as journal_module
from extproc.telemetry import metering
from extproc.telemetry.journal import Journal
from extproc.telemetry.metering import DecisionRecord, MeteringStore
from extproc.telemetry.metrics import METERING_DROPPED, METERING_HELD
from tests.core.metering_rows import record as _rec


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
        return real_write(conn, insert, rows)

    monkeypatch.setattr(MeteringStore, "_write", staticmethod(slow_write))
    store = MeteringStore(db, queue_limit=5)
    accepted = [i for i in range(20) if store.record(_rec(f"r{i}"))]
    assert 5 <= len(accepted) < 20  # bounded: the rest were refused at once
    gate.set()
    store.close()
    assert set(_rows(db)) == {f"r{i}" for i in accepted}


def test_rows_the_disk_refuses_are_held_and_stored_once_it_takes_writes_again(tmp_path: Path, monkeypatch) -> None:
    db = tmp_path / "m.sqlite"
    full = threading.Event()
    full.set()
    refused = threading.Event()

    def executemany(conn, insert, rows):  # SQLite's own words for a full disk
        if full.is_set():
            refused.set()
            raise sqlite3.OperationalError("database or disk is full")
        return conn.executemany(insert, rows)

    store = MeteringStore(db)
    monkeypatch.setattr(metering, "_executemany", executemany)
    dropped = METERING_DROPPED.labels("held_full")._value.get()
    for i in range(5):
        assert store.record(_rec(f"r{i}"))
    assert refused.wait(10)
    _until(lambda: store.held == 5)
    assert _rows(db) == {} and METERING_HELD._value.get() == 5
    store.record(_rec("r5"))
    _until(lambda: store.held == 6)
    full.clear()  # space comes back: the next retry (within RETRY_S) stores them
    _until(lambda: store.held == 0)
    store.close()
    assert set(_rows(db)) == {f"r{i}" for i in range(6)}
    assert METERING_DROPPED.labels("held_full")._value.get() == dropped and METERING_HELD._value.get() == 0


def test_past_the_bound_the_newest_refused_rows_are_dropped_and_counted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(metering, "HELD_LIMIT", 3)
    monkeypatch.setattr(metering, "_executemany", lambda conn, insert, rows: (_ for _ in ()).throw(
        sqlite3.OperationalError("disk I/O error")))
    store = MeteringStore(tmp_path / "m.sqlite")
    dropped = METERING_DROPPED.labels("held_full")._value.get()
    with store._journal.lock:  # one batch: all five reach the writer together
        for i in range(5):
            store._queue.put((1.0, f"r{i}", "t", "", "m", "c", "", 200, 1.0, None, 1, 1, 0.0, "", "", None))
            store._journal.count()
    _until(lambda: store.held == 3)
    assert METERING_DROPPED.labels("held_full")._value.get() == dropped + 2


def _until(ok, within: float = 10.0) -> None:
    deadline = time.monotonic() + within  # a bound on a wait for a thread, not a speed assertion
    while not ok():
        assert time.monotonic() < deadline
        time.sleep(0.01)



# ---------------------------------------------------------------- the journal: a SIGKILL loses no row

ROOT = Path(__file__).resolve().parents[2]

# The child accepts rows while its writer gathers for a minute, then SIGKILLs itself: no commit.
_KILLED_CHILD = """
import os, signal, sys
from extproc.telemetry import metering
from tests.core.metering_rows import decision as _decision, record as _rec
metering._GATHER_S = 60.0
store = metering.MeteringStore(sys.argv[1])
for i in range(int(sys.argv[2])):
    assert store.record(_rec(f"r{i}", ts=1000.0 + i / 7, cost=i * 0.1))
    assert store.record_decision(_decision(f"r{i}", allowed=i % 2 == 0))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_child(db: Path, n: int) -> None:
    r = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(db), str(n)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])


def _lines(journal: Path) -> bytes:
    """A segment's lines: a mapped one is MAP_BYTES long, zeros after its last line."""
    return journal.read_bytes().rstrip(b"\0")


def _journal_files(db: Path) -> list[Path]:
    return sorted(p for p in db.parent.glob(f"{db.name}.journal.*") if not p.name.endswith(".lock"))


def test_rows_accepted_before_a_sigkill_are_replayed_at_the_next_start(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    _killed_child(db, 300)
    assert _count(db, "requests") == 0 and _count(db, "decisions") == 0  # the writer never committed
    MeteringStore(db).close()
    rows = _rows(db)
    assert set(rows) == {f"r{i}" for i in range(300)} and _count(db, "requests") == 300
    assert rows["r7"][0] == 1000.0 + 7 / 7 and rows["r7"][12] == 7 * 0.1  # values exact through JSON
    with sqlite3.connect(db) as conn:
        decisions = conn.execute("SELECT task_id, allowed, limited_by FROM decisions ORDER BY rowid").fetchall()
    assert decisions == [(f"r{i}", int(i % 2 == 0), "" if i % 2 == 0 else "t:tpm") for i in range(300)]
    assert [p.read_bytes() for p in _journal_files(db)] == []  # a clean close leaves no journal


def test_replaying_the_same_journal_twice_stores_each_row_once(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    store = MeteringStore(db)  # rows committed before the crash are not doubled by the replay either
    store.record(_rec("before"))
    store.close()
    _killed_child(db, 50)
    saved = {p: p.read_bytes() for p in _journal_files(db)}
    assert saved
    MeteringStore(db).close()
    for p, data in saved.items():  # as if the replaying process died before it truncated the journal
        p.write_bytes(data)
    MeteringStore(db).close()
    assert _count(db, "requests") == 51 and _count(db, "decisions") == 50
    assert set(_rows(db)) == {"before", *(f"r{i}" for i in range(50))}


def test_the_writer_trims_the_journal_once_every_row_is_committed(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    store = MeteringStore(db)
    for i in range(20):
        store.record(_rec(f"r{i}"))
    deadline = time.monotonic() + 10
    while _count(db, "requests") < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    [journal] = _journal_files(db)
    assert _lines(journal).count(b"\n") == 1 and _lines(journal).startswith(b"h")  # its header alone
    store.close()


def test_a_live_store_keeps_its_journal_from_a_second_one_on_the_same_database(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    first, second = MeteringStore(db), MeteringStore(db)  # two workers: one slot each
    first.record(_rec("a"))
    second.record(_rec("b"))
    first.close()
    second.close()
    assert set(_rows(db)) == {"a", "b"}


def test_a_journal_that_never_catches_up_rotates_and_drops_a_segment_once_it_is_committed(tmp_path: Path,
                                                                                          monkeypatch) -> None:
    monkeypatch.setattr(journal_module, "ROTATE_BYTES", 100)
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")
    for i in range(10):  # 10 rows of 20 bytes: past ROTATE_BYTES
        with j.lock:
            j.append(b"r[%03d,\"0123456789\"]\n" % i)
    j.settle(5, lambda: b"h{\"new\":1}\n")  # 5 of 10 committed: not caught up, so rotate
    old = tmp_path / "x.sqlite.journal.0.old"
    assert old.exists()
    with j.lock:
        j.append(b"r[010,\"after\"]\n")
    [lines] = j.segments()
    assert lines[0] == b"h{}" and len([x for x in lines if x[:1] == b"r"]) == 11 and lines[-1] == b'r[010,"after"]'
    j.settle(5, lambda: b"h{}\n")  # the old segment's rows are all committed; the newest is not
    assert not old.exists()
    assert _lines(tmp_path / "x.sqlite.journal.0") == b'h{"new":1}\nr[010,"after"]\n'
    j.settle(1, lambda: b"h{\"caught\":1}\n")
    assert _lines(tmp_path / "x.sqlite.journal.0") == b'h{"caught":1}\n'
    j.close()
    assert not (tmp_path / "x.sqlite.journal.0").exists()


def test_lines_past_the_map_go_by_write_in_order_and_a_reset_maps_them_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(journal_module, "MAP_BYTES", 64)
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")
    path = tmp_path / "x.sqlite.journal.0"
    assert path.stat().st_size == 64  # mapped: the zeros are written up front
    for i in range(5):  # 5 rows of 20 bytes: the map holds two, the rest go past its end
        with j.lock:
            j.append(b"r[%03d,\"0123456789\"]\n" % i)
    assert path.stat().st_size > 64
    [lines] = j.segments()
    assert lines == [b"h{}", *(b"r[%03d,\"0123456789\"]" % i for i in range(5))]
    j.settle(5, lambda: b"h{\"n\":5}\n")
    assert path.read_bytes() == b'h{"n":5}\n'.ljust(64, b"\0")  # the lines past the map cut off
    with j.lock:
        j.append(b"r[005,\"x\"]\n")
    assert _lines(path) == b'h{"n":5}\nr[005,"x"]\n' and path.stat().st_size == 64
    j.settle(1, lambda: b"h{}\n")
    j.close()
    assert not path.exists()


def test_a_segment_that_cannot_be_mapped_is_written_and_mapped_once_it_can(tmp_path: Path, monkeypatch) -> None:
    def refused(*_a, **_k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(journal_module.mmap, "mmap", refused)
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")
    path = tmp_path / "x.sqlite.journal.0"
    with j.lock:
        j.append(b"r[1]\n")
    assert path.read_bytes() == b"h{}\nr[1]\n"  # by write(2), as before the map
    monkeypatch.undo()
    j.settle(1, lambda: b"h{\"n\":1}\n")  # caught up: a mapped segment replaces it
    assert path.stat().st_size == journal_module.MAP_BYTES and _lines(path) == b'h{"n":1}\n'
    with j.lock:
        j.append(b"r[2]\n")
    assert [*j.segments()] == [[b'h{"n":1}', b"r[2]"]]
    j.close()


def test_a_disk_without_room_to_spare_gets_no_map_and_no_attempt_at_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(journal_module, "MAP_BYTES", 1 << 50)  # no disk here has four of these free
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")
    path = tmp_path / "x.sqlite.journal.0"
    with j.lock:
        j.append(b"r[1]\n")
    assert path.read_bytes() == b"h{}\nr[1]\n"  # by write(2): the map would take the databases' room
    j.settle(1, lambda: b"h{\"n\":1}\n")  # caught up: no mapped segment is tried where none fits
    assert path.read_bytes() == b'h{"n":1}\n' and not (tmp_path / "x.sqlite.journal.0.new").exists()
    j.close()


# ---------------------------------------------------------------- key ids: a column added to older files

_OLD_REQUESTS = """CREATE TABLE requests (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, model TEXT, cluster TEXT,
    channel TEXT, status INTEGER, latency_ms REAL, ttft_ms REAL, input_tokens INTEGER,
    output_tokens INTEGER, cost REAL, strategy TEXT, arm TEXT)"""
_OLD_DECISIONS = """CREATE TABLE decisions (
    ts REAL NOT NULL, task_id TEXT NOT NULL, tenant TEXT, tier TEXT, cluster TEXT, channel TEXT,
    model TEXT, allowed INTEGER NOT NULL, requests INTEGER NOT NULL, tokens INTEGER NOT NULL,
    limited_by TEXT, rule TEXT, store TEXT)"""


def test_an_older_store_gains_the_key_id_column_and_its_journal_still_replays(tmp_path: Path) -> None:
    db = tmp_path / "m.sqlite"
    with sqlite3.connect(db) as conn:  # a file written before key ids were metered
        conn.execute(_OLD_REQUESTS)
        conn.execute(_OLD_DECISIONS)
        conn.execute("INSERT INTO requests VALUES (1.0, 'old', 't', 'L1', 'm', 'c', 'standard', 200, 1.0, NULL, "
                     "3, 4, 0.5, '', '')")
    # ... and a process of that version SIGKILLed with one row only in its journal (15 values, no key id)
    old_line = b'r[2.0,"journaled","t","L1","m","c","standard",200,1.0,null,5,6,0.25,"",""]\n'
    old_decision = b'd[2.0,"journaled","t","L1","c","standard","m",1,1,42,"","","memory"]\n'
    (tmp_path / "m.sqlite.journal.0").write_bytes(b'h{"requests":1,"decisions":0}\n' + old_line + old_decision)
    store = MeteringStore(db)
    store.record(_rec("new", key_id="key_123"))
    store.record_decision(DecisionRecord(ts=3.0, task_id="new", tenant="t", tier="L1", cluster="c",
                                         channel="standard", model="m", allowed=False, requests=1, tokens=9,
                                         limited_by="budget:key:key_123", rule="1 usd per day", store="budget",
                                         key_id="key_123"))
    store.close()
    MeteringStore(db).close()  # a second open: the column is there already, nothing replays twice
    with sqlite3.connect(db) as conn:
        rows = {r[0]: r[1:] for r in conn.execute("SELECT task_id, key_id, cost FROM requests")}
        decisions = conn.execute("SELECT task_id, store, key_id FROM decisions ORDER BY rowid").fetchall()
    assert rows == {"old": (None, 0.5), "journaled": (None, 0.25), "new": ("key_123", 0.0)}
    assert decisions == [("journaled", "memory", None), ("new", "budget", "key_123")]
