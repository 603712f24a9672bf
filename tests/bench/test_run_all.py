"""run_all: a failing bench is named and fails the run, and the benches after it still run."""

from __future__ import annotations

import time
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


def test_a_bench_past_its_timeout_is_named_and_its_children_go_with_it(tmp_path: Path, monkeypatch) -> None:
    pid_file = tmp_path / "child.pid"
    (tmp_path / "bench_slow.py").write_text(
        "import subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n")
    monkeypatch.setattr(run_all, "HERE", tmp_path)
    monkeypatch.setattr(run_all, "TIMEOUT_S", 8)
    run = run_all.run_one(tmp_path / "bench_slow.py")
    assert run.failure == "bench_slow.py (timed out after 8s)"
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
