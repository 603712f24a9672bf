"""bench/scratch.py: a benchmark leaves its scratch folders behind only when they explain a failure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import scratch


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "_made", [])
    monkeypatch.setattr(scratch, "_kept", set())


def _bench(rc: int, pointed_at: bool = False) -> tuple[list[Path], int]:
    made: list[Path] = []

    def main() -> int:
        made.append(scratch.folder("bench-scratch-test-"))
        (made[0] / "log").write_text("what happened")
        made.append(scratch.folder("bench-scratch-test-"))
        if pointed_at:
            scratch.keep(made[1])
        if rc < 0:
            raise RuntimeError("the bench broke")
        return rc

    return made, scratch.run(main)


def test_a_run_that_ends_well_removes_its_folders() -> None:
    made, rc = _bench(0)
    assert rc == 0 and not any(p.exists() for p in made)


def test_a_failed_run_keeps_and_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    made, rc = _bench(1)
    assert rc == 1 and all(p.exists() for p in made)
    err = capsys.readouterr().err
    assert all(f"kept {p}" in err for p in made)
    for p in made:
        shutil.rmtree(p)


def test_a_bench_that_raises_keeps_them() -> None:
    with pytest.raises(RuntimeError):
        _bench(-1)
    kept = list(scratch._made)
    assert len(kept) == 2 and all(p.exists() for p in kept)
    for p in kept:
        shutil.rmtree(p)


def test_a_folder_the_bench_pointed_at_outlives_a_good_run() -> None:
    made, rc = _bench(0, pointed_at=True)
    assert rc == 0 and not made[0].exists() and made[1].exists()
    shutil.rmtree(made[1])
