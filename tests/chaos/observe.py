"""What the gateway recorded about a scenario: /metrics series, metering rows, process memory."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx


def metric(metrics_address: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and all(w in line for w in want):
            total += float(line.rsplit(" ", 1)[1])
    return total


def metered_rows(db: str | Path, task_ids: set[str], timeout: float = 10.0) -> dict[str, int]:
    """task id -> metered status, for those of `task_ids` whose rows are written within `timeout`
    (the writer thread batches inserts, so a row lands a moment after its answer)."""
    deadline = time.monotonic() + timeout
    found: dict[str, int] = {}
    while True:
        if Path(db).exists():
            with sqlite3.connect(db, timeout=10) as conn:
                try:
                    found = {t: s for t, s in conn.execute("SELECT task_id, status FROM requests") if t in task_ids}
                except sqlite3.OperationalError:
                    found = {}  # the table is created by the writer's first batch
        if len(found) == len(task_ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def rss_kib(pid: int) -> int:
    """Resident memory of a process, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")
