"""Reading what a running stack metered: its SQLite store, as the request path wrote it."""

from __future__ import annotations

import sqlite3
import time


def metered_row(stack, task_id: str, timeout: float = 5.0) -> tuple:
    """The request's row in the extproc's SQLite metering store (the writer thread commits promptly)."""
    deadline = time.monotonic() + timeout
    while True:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as conn:
            row = conn.execute("SELECT model, cluster, status, input_tokens, output_tokens, cost FROM requests "
                               "WHERE task_id = ?", (task_id,)).fetchone()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no metering row for task {task_id}"
            return row
        time.sleep(0.05)


def metered_cache(stack, task_id: str, timeout: float = 5.0) -> tuple:
    """The request's prompt-cache columns: (input, read, write, 1-hour write, cost, cache_saved)."""
    metered_row(stack, task_id, timeout)  # waits for the row
    with sqlite3.connect(stack.cfg.extproc.metering_db) as conn:
        return conn.execute("SELECT input_tokens, cache_read_tokens, cache_write_tokens, cache_write_1h_tokens, cost, "
                            "cache_saved FROM requests WHERE task_id = ?", (task_id,)).fetchone()
