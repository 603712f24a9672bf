"""run_all: a failing bench is named and fails the run, and the benches after it still run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import run_all

PASS = 'print("SUMMARY " + \'[{"bench": "%s", "case": "c", "metric": "m", "value": 1, "unit": "u"}]\')\n'
FAIL = 'print("FAILED: bad c: 3 requests got 503 x3")\nprint("SUMMARY []")\nraise SystemExit(1)\n'


def test_a_failed_bench_fails_the_run_and_the_others_still_run(tmp_path: Path, monkeypatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bench_a.py").write_text(PASS % "a")
    (tmp_path / "bench_bad.py").write_text(FAIL)
    (tmp_path / "bench_z.py").write_text(PASS % "z")
    (tmp_path / "bench_silent.py").write_text("pass\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    assert run_all.main([]) == 1
    out = capsys.readouterr().out
    summary = out[out.index("== summary"):]
    assert "a           c" in summary and "z           c" in summary
    failed = out[out.index("FAILED benches"):].splitlines()[1:]
    assert failed == ["  bench_bad.py (exit 1)", "    FAILED: bad c: 3 requests got 503 x3",
                      "  bench_silent.py (no SUMMARY line)"]


def test_all_passing_benches_exit_zero(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "bench_a.py").write_text(PASS % "a")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    assert run_all.main([]) == 0
