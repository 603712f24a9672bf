"""`modelyard ratelimit tune --since/--until`: a real metering store holding decisions of
different ages, read through the CLI as a subprocess; the window's pure parts directly."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extproc.telemetry.metering import DecisionRecord, MeteringStore, MeterRecord
from ratelimit.tuning.report import Span, iso
from ratelimit.tuning.traces import Window, parse_trace, read_metering

ROOT = Path(__file__).resolve().parents[2]
DAY = 86400.0
# tenant -> how long ago its salvo of decisions was made
AGES = {"month-old": 30 * DAY, "three-days": 3 * DAY, "this-hour": 0.5 * 3600}


def _store(path: Path, now: float) -> None:
    """Ten decisions per tenant, a second apart, at its age; every third refused, each admitted
    call with its requests row (the upstream's usage)."""
    store = MeteringStore(path)
    for tenant, age in AGES.items():
        for i in range(10):
            ts, task, allowed = now - age + i, f"{tenant}-{i}", i % 3 != 0
            store.record_decision(DecisionRecord(ts, task, tenant, "L1", "gpu", "standard", "m", allowed, 1, 40,
                                                 "" if allowed else f"tenant:{tenant}:requests",
                                                 "" if allowed else f"tenant:{tenant}:requests", "memory"))
            if allowed:
                store.record(MeterRecord(ts, task, tenant, "L1", "m", "gpu", "standard", 200, 1.0, None, 10, 20,
                                         0.0, "s", ""))
    store.close()


def _tune(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modelyard.cli", "ratelimit", "tune", "--metering-db", str(db),
                           "--no-config", "--rate", "1", "--key", "tenant", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)


def _keys(out: str) -> dict[str, int]:
    return {k["key"]: k["requests"] for k in json.loads(out)["keys"]}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    path = tmp_path_factory.mktemp("window") / "metering.sqlite"
    now = time.time()
    _store(path, now)
    return path, now


def test_the_default_is_the_last_seven_days(db: tuple[Path, float]) -> None:
    path, now = db
    r = _tune(path, "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert _keys(r.stdout) == {"three-days": 10, "this-hour": 10}  # the month-old salvo is not read
    w = doc["window"]
    assert w["since_arg"] == "7d" and w["default"] is True and w["until_arg"] is None
    since = w["since"]
    assert iso(now - 7 * DAY - 60) < since <= iso(time.time() - 7 * DAY)  # a week before the run
    assert since < w["until"] <= iso(time.time())  # pinned to the run's own time


def test_since_and_until_take_durations_and_times(db: tuple[Path, float]) -> None:
    path, now = db
    r = _tune(path, "--json", "--since", "2d")
    assert r.returncode == 0, r.stderr
    assert _keys(r.stdout) == {"this-hour": 10}
    r = _tune(path, "--json", "--since", "40d", "--until", "1d")
    assert r.returncode == 0, r.stderr
    assert _keys(r.stdout) == {"month-old": 10, "three-days": 10}
    start = iso(now - 31 * DAY)
    assert start is not None
    r = _tune(path, "--json", "--since", start, "--until", iso(now - 29 * DAY) or "")
    assert r.returncode == 0, r.stderr
    assert _keys(r.stdout) == {"month-old": 10}
    assert json.loads(r.stdout)["window"]["since"] == start


def test_the_table_says_which_window_was_read(db: tuple[Path, float]) -> None:
    path, _ = db
    r = _tune(path, "--since", "2d", "--quiet-curves")
    assert r.returncode == 0, r.stderr
    window = [line for line in r.stdout.splitlines() if line.startswith("window: ")]
    assert len(window) == 1 and window[0].endswith("(--since 2d)"), r.stdout
    assert "this-hour" in r.stdout and "three-days" not in r.stdout
    r = _tune(path, "--quiet-curves")
    assert "(--since 7d, the default)" in r.stdout


def test_an_empty_window_and_a_bad_time_are_clear_errors(db: tuple[Path, float]) -> None:
    path, _ = db
    r = _tune(path, "--since", "60d", "--until", "45d")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no events in window: " in r.stderr and "the store holds 30" in r.stderr, r.stderr
    r = _tune(path, "--since", "soon")
    assert r.returncode == 2 and "--since 'soon': expected 7d, 12h, 30m or an ISO date" in r.stderr, r.stderr
    r = _tune(path, "--since", "1d", "--until", "2d")
    assert r.returncode == 2 and "must be before --until" in r.stderr, r.stderr


def test_read_metering_selects_the_window_in_sql(db: tuple[Path, float]) -> None:
    path, now = db
    trace = read_metering(path, Window(now - 4 * DAY, now - DAY))
    assert set(trace.cols["tenant"]) == {"three-days"} and len(trace) == 10
    assert trace.live_refused == [i % 3 == 0 for i in range(10)]
    assert trace.tok_nano[1] == 30 * 10**9  # an admitted call's usage still joined from its requests row
    assert len(read_metering(path)) == 30


def test_a_window_cuts_a_file_trace_at_its_edges() -> None:
    tr = parse_trace("timestamp,tenant\n10,a\n20,b\n20.5,c\n30,d\n", "csv")
    assert Window(20, 30).cut(tr).cols["tenant"] == ["b", "c"]  # since included, until not
    assert Window(None, 20.5).cut(tr).cols["tenant"] == ["a", "b"]
    assert Window().cut(tr) is tr
    assert Window(10, 20).sql() == ("ts >= ? AND ts < ?", (10, 20)) and Window().sql() == ("1", ())


def test_span_describes_what_was_asked() -> None:
    assert Span().describe() == "window: the whole input"
    s = Span(Window(0.0, 86400.0), "1970-01-01", "1d")
    assert s.describe() == "window: 1970-01-01T00:00:00Z .. 1970-01-02T00:00:00Z (--since 1970-01-01, --until 1d)"
    assert s.as_json()["until"] == "1970-01-02T00:00:00Z"
