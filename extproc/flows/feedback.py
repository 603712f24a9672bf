"""`POST /v1/feedback`: a caller scores one of its own calls (by the task id the answer carried);
the score is stored beside that call's metering row, and `modelyard route ab` counts it per arm.

Body: `{"task_id": "...", "score": 0..1, "labels": {"name": "value", ...}}` (labels optional, at
most 16, short). A task id the caller's tenant did not make reads as not found, like an unknown one.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from pathlib import Path

import orjson

from contracts.errors import ClientError, NotFound, Unavailable
from extproc import messages as msg
from extproc.context import RequestContext, json_object, json_response
from extproc.gateway import Gateway
from extproc.routing.bandit import ADAPTIVE
from extproc.telemetry.metering import FeedbackRecord

MAX_LABELS = 16
MAX_LABEL_CHARS = 256
# The serving worker's writer commits its row within tens of milliseconds (metering._GATHER_S);
# feedback sent right after the answer, to another worker, waits that long for it.
_FIND_FOR_S = 1.0


async def record(gw: Gateway, ctx: RequestContext, body: bytes) -> msg.ProcessingResponse:
    task_id, score, labels = _parse(body)
    store = gw.accountant.metering
    assert ctx.tenant is not None
    if store is None:
        raise NotFound("feedback needs the metering store (extproc.metering_db)")
    try:
        row = await asyncio.to_thread(_owner, store.path, task_id)
    except sqlite3.Error as e:  # locked past its timeout, or the disk: a retry may find it
        raise Unavailable(f"the metering store cannot be read now ({e})", retry_after_s=1) from None
    if row is None or row[0] != ctx.tenant.name:
        raise NotFound(f"task {task_id!r} not found")
    owner, model, channel, strategy, arm = row
    label_json = orjson.dumps(labels).decode() if labels else None
    key_id = ctx.caller.key_id if ctx.caller is not None else None
    if not store.record_feedback(FeedbackRecord(time.time(), task_id, owner, key_id, score, label_json)):
        raise Unavailable("the metering store is behind; retry", retry_after_s=1)
    if strategy == ADAPTIVE and arm:  # the learning strategy routed it: the score is part of its reward
        gw.dispatcher.scheduler.learn_feedback(model, channel, owner, arm, score, time.monotonic())
    return json_response(201, {"object": "feedback", "task_id": task_id, "score": score, "labels": labels}, ctx)


def _parse(body: bytes) -> tuple[str, float, dict[str, object]]:
    doc = json_object(body)
    task_id = doc.get("task_id")
    if not isinstance(task_id, str) or not 0 < len(task_id) <= 128:
        raise ClientError("`task_id` must be the task id of one of your calls (its x-modelyard-task-id header)")
    raw = doc.get("score")
    score = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else math.nan
    if not 0 <= score <= 1:
        raise ClientError("`score` must be a number from 0 (bad) to 1 (good)")
    labels = doc.get("labels") or {}
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
            isinstance(k, str) and len(k) <= 64 and (type(v) in (int, float, bool) or
                                                     (isinstance(v, str) and len(v) <= MAX_LABEL_CHARS))
            for k, v in labels.items()):
        raise ClientError(f"`labels` must be an object of at most {MAX_LABELS} short names to strings, "
                          "numbers or booleans")
    return task_id, score, labels


def _owner(path: Path, task_id: str) -> tuple[str, str, str, str, str] | None:
    """The tenant, model, channel, strategy and arm of the call `task_id` names, from the metering
    store (off the event loop)."""
    deadline = time.monotonic() + _FIND_FOR_S
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1.0)
    try:
        while True:
            row = conn.execute("SELECT tenant, model, channel, strategy, arm FROM requests WHERE task_id = ? LIMIT 1",
                               (task_id,)).fetchone()
            if row is not None or time.monotonic() > deadline:
                return None if row is None else tuple(str(v or "") for v in row)  # type: ignore[return-value]
            time.sleep(0.05)
    finally:
        conn.close()
