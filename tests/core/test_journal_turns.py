"""On an event loop a journal writes each loop turn's lines in one write, at the end of the turn;
off a loop each line at once. Lines of rows already committed are never written after a trim."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from extproc.telemetry.journal import Journal


@pytest.fixture
def journal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")
    writes: list[bytes] = []
    real = os.write

    def counting(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", counting)
    yield j, writes, tmp_path / "x.sqlite.journal.0"
    j.close()


def _append(j: Journal, line: bytes) -> None:
    with j.lock:
        j.append(line)


def test_off_a_loop_each_line_is_written_at_once(journal) -> None:
    j, writes, path = journal
    _append(j, b"r[1]\n")
    _append(j, b"r[2]\n")
    assert writes == [b"r[1]\n", b"r[2]\n"]
    assert path.read_bytes() == b"h{}\nr[1]\nr[2]\n"


def test_on_a_loop_the_lines_of_one_turn_go_in_one_write_at_its_end(journal) -> None:
    j, writes, path = journal

    async def turn() -> bytes:
        _append(j, b"r[1]\n")
        _append(j, b"d[2]\n")
        during = path.read_bytes()
        await asyncio.sleep(0)  # the turn ends: the callback writes
        await asyncio.sleep(0)
        return during

    assert asyncio.run(turn()) == b"h{}\n"
    assert writes == [b"r[1]\nd[2]\n"]
    assert path.read_bytes() == b"h{}\nr[1]\nd[2]\n"


def test_a_trim_drops_lines_of_committed_rows_still_waiting(journal) -> None:
    j, writes, path = journal

    async def turn() -> None:
        _append(j, b"r[1]\n")
        j.settle(1, lambda: b'h{"requests":1}\n')  # the writer committed that row before the turn ended
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(turn())
    assert path.read_bytes() == b'h{"requests":1}\n'  # no line after the header that would replay twice


def test_close_writes_what_still_waits(tmp_path: Path) -> None:
    j = Journal(tmp_path / "x.sqlite")
    j.start(b"h{}\n")

    async def turn() -> None:
        _append(j, b"r[1]\n")
        j.close()  # SIGTERM's drain, inside the turn: the waiting line is written, and kept (not committed)

    asyncio.run(turn())
    assert (tmp_path / "x.sqlite.journal.0").read_bytes() == b"h{}\nr[1]\n"
