"""The batch a writer thread takes from its queue: the rows waiting, gathered for a moment first.

Shared by the metering and audit writers (SQLite, one commit per batch). Under load a short wait
after the first row turns many wake-ups and commits, each costing more CPU (and GIL hand-offs
with the event loop) than the row itself, into one.
"""

from __future__ import annotations

import queue
import time
from typing import Any


def next_batch(q: queue.Queue[Any] | queue.SimpleQueue[Any], stop: object, limit: int, gather_s: float,
               wait_s: float | None = None) -> list[Any]:
    """Block for one item (at most `wait_s`, then an empty batch: a writer holding rows to retry
    must wake), wait `gather_s` unless `limit` already wait, then take up to `limit`; the batch
    ends at `stop` (the writer's last item) if it comes."""
    try:
        batch = [q.get(timeout=wait_s)]
    except queue.Empty:
        return []
    if batch[0] is not stop and q.qsize() < limit:
        time.sleep(gather_s)
    while len(batch) < limit and batch[-1] is not stop:
        try:
            batch.append(q.get_nowait())
        except queue.Empty:
            break
    return batch
