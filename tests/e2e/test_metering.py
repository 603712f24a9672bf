"""Every request is metered (tokens, channel, latency, cost) into SQLite, and the rate-limit
tuner replays that store."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack

pytestmark = pytest.mark.e2e


def test_requests_are_metered_and_tunable(tmp_path: Path) -> None:
    data = small_config()
    data["models"][0]["cost"] = {"input_per_1k": 1.0, "output_per_1k": 2.0}
    with start_stack(tmp_path, data) as stack:
        db = Path(stack.cfg.extproc.metering_db)
        for i in range(5):
            r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                           json={"model": "demo-gpt", "stream": i == 4,
                                 "messages": [{"role": "user", "content": f"meter me number {i}"}]}, timeout=10)
            assert r.status_code == 200
            task_ids = r.headers["x-modelyard-task-id"]
    # The stack stopped: SIGTERM drained the extproc, which flushed the store.
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT task_id, tenant, tier, model, cluster, channel, status, latency_ms, "
                            "input_tokens, output_tokens, cost FROM requests ORDER BY ts").fetchall()
    assert len(rows) == 5
    assert rows[-1][0] == task_ids  # the streamed one, metered from its usage chunk
    for _, tenant, tier, model, cluster, channel, status, latency, tin, tout, cost in rows:
        assert (tenant, tier, model, cluster, channel, status) == ("demo", "L1", "demo-gpt", "demo-openai", "standard", 200)
        assert latency > 0 and tin == 4 and tout > 0
        assert cost == pytest.approx(tin / 1000 * 1.0 + tout / 1000 * 2.0)
    out = subprocess.run([sys.executable, "-m", "modelyard.cli", "ratelimit", "tune", "--metering-db", str(db),
                          "--rate", "1", "--unit", "tokens", "--plot", str(tmp_path / "plot.svg")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "demo" in out.stdout and "<svg" in (tmp_path / "plot.svg").read_text()
