"""7c. The run directory's disk fills up under the metering and audit writers, then space comes
back: every request is still answered, no row is lost (counted before and after), what the disk
refused is reported (a metric and a log line) and held in memory, and it is all stored once the
disk takes writes again, without a restart."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import openai
import pytest

from extproc.telemetry.journal import MAP_BYTES
from tests.chaos.figures import record
from tests.chaos.observe import metered_rows, metric
from tests.chaos.small_disk import fill, small_disk
from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]
MAX_FULL_REQUESTS = 300  # the writers must have met the full disk well before this many
# Room for both stores' mapped journals (MAP_ROOM maps free each) and their databases before the fill.
DISK_KIB = 8192


def _audit_calls(db: Path, task_ids: set[str]) -> int:
    with sqlite3.connect(db, timeout=10) as conn:
        return sum(1 for (t,) in conn.execute("SELECT task_id FROM audit WHERE event = 'call'") if t in task_ids)


def _until(ok, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within  # a bound on waiting for a writer's retry, not a speed check
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_full_run_disk_loses_no_metering_or_audit_row_and_recovers(tmp_path: Path) -> None:
    with small_disk(tmp_path / "run", DISK_KIB) as run:
        data = small_config()
        data["extproc"].update(metering_db=str(run / "metering.sqlite"), audit_db=str(run / "audit.sqlite"),
                               tasks=None, batches=None)
        with start_stack(tmp_path, data) as stack:
            metrics = data["extproc"]["metrics_address"]
            client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=20)
            ids: list[str] = []

            def ask(text: str) -> None:
                r = client.chat.completions.with_raw_response.create(
                    model="demo-gpt", messages=[{"role": "user", "content": text}])
                assert r.http_response.status_code == 200 and r.parse().choices[0].message.content
                ids.append(r.headers["x-modelyard-task-id"])

            for i in range(10):
                ask(f"before {i}")
            assert len(metered_rows(stack.cfg.extproc.metering_db, set(ids))) == 10
            # Mapped journals: their copies must not fault once the disk is full (zeros written up front).
            assert all((run / f"{db}.sqlite.journal.0").stat().st_size >= MAP_BYTES for db in ("metering", "audit"))
            filler = fill(run)
            full_from = len(ids)
            for i in range(MAX_FULL_REQUESTS):  # every one answered while the writers meet the full disk
                ask(f"full {i}")
                if metric(metrics, "modelyard_metering_rows_held") > 0 and \
                        metric(metrics, "modelyard_audit_write_errors_total") > 0 and i >= 20:
                    break
            during = len(ids) - full_from
            held = metric(metrics, "modelyard_metering_rows_held")
            assert held > 0, "the metering writer never met the full disk"
            assert metric(metrics, "modelyard_metering_write_errors_total") > 0
            assert metric(metrics, "modelyard_audit_write_errors_total") > 0
            assert metric(metrics, "modelyard_metering_rows_dropped_total") == 0
            filler.unlink()  # space comes back
            t_free = time.monotonic()
            assert _until(lambda: metric(metrics, "modelyard_metering_rows_held") == 0
                          and metric(metrics, "modelyard_audit_queue_rows") == 0)
            stored_s = time.monotonic() - t_free
            for i in range(5):
                ask(f"after {i}")
            metered = metered_rows(stack.cfg.extproc.metering_db, set(ids))
            assert _until(lambda: _audit_calls(run / "audit.sqlite", set(ids)) == len(ids))
            log = next(c for c in stack.children if c.name == "extproc").log_path(stack.log_dir).read_text()
    record("run disk full", f"the run dir's {DISK_KIB // 1024} MiB filesystem filled mid-load, then freed",
           ok_rps="n/a", lost=len(ids) - len(metered), recovery_s=round(stored_s, 2),
           detail=f"{during} requests (all 200) on the full disk; {held:.0f} metering rows held in memory "
                  f"and {len(ids)} metering + {len(ids)} audit rows stored once it was freed")
    assert len(metered) == len(ids) and set(metered.values()) == {200}  # each once: task ids are keys
    assert "metering: the disk refuses writes; holding" in log and "metering: writes resumed" in log
    assert "audit: cannot write" in log and "audit: writes resumed" in log
