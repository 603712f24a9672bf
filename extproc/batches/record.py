"""A batch's record and what callers see of it, pure: OpenAI's batch object and output/error JSONL,
Anthropic's message batch and results JSONL, counted from the line tasks' records.

Status: in_progress -> completed; in_progress -> cancelling -> cancelled; in_progress -> expired
(the completion window ran out: lines still open are cancelled). A batch ends once every line
task has ended; its files are written then (`finish`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from extproc.batches.lines import LineRef
from extproc.tasks.state import TaskRecord

Api = Literal["openai", "anthropic"]
OPEN = frozenset({"in_progress", "cancelling"})
WINDOWS = {"24h": 24 * 3600}  # the completion windows OpenAI accepts; Anthropic's is 24h too


@dataclass(frozen=True, slots=True)
class BatchRecord:
    id: str
    tenant: str
    api: Api
    endpoint: str
    created_at: float
    expires_at: float
    lines: tuple[LineRef, ...]
    input_file_id: str | None = None
    completion_window: str = "24h"
    metadata: dict[str, Any] | None = None
    status: str = "in_progress"
    cancelling_at: float | None = None
    finalizing_at: float | None = None
    completed_at: float | None = None
    cancelled_at: float | None = None
    expired_at: float | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    results_file_id: str | None = None  # Anthropic's results JSONL
    counts: dict[str, int] = field(default_factory=dict)  # frozen at the end
    # A batch run at the provider's own batch API (extproc/batches/native.py): the target (model,
    # cluster, protocol, upstream_model) and the provider's batch id; None: lines replayed here.
    native: dict[str, Any] | None = None

    @property
    def open(self) -> bool:
        return self.status in OPEN

    @property
    def task_ids(self) -> list[str]:
        return [ref.task_id for ref in self.lines if ref.task_id is not None]


# -- one line's outcome -------------------------------------------------------------------------
Outcome = Literal["open", "succeeded", "failed", "cancelled", "expired", "refused"]


def outcome(ref: LineRef, task: TaskRecord | None, rec: BatchRecord) -> Outcome:
    if ref.task_id is None:
        return "refused"
    if task is None:  # purged, or never stored (a crash between the tasks and the record)
        return "failed"
    if task.status in ("queued", "running"):
        return "open"
    if task.status == "cancelled":
        return "expired" if rec.status == "expired" or rec.expired_at is not None else "cancelled"
    return "succeeded" if task.status == "succeeded" else "failed"


def _body(raw: bytes | None) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace")


def counts(rec: BatchRecord, tasks: Mapping[str, TaskRecord | None]) -> dict[str, int]:
    """The request counts in the batch's own API's terms."""
    if not rec.open and rec.counts:
        return rec.counts
    tally = dict.fromkeys(("open", "succeeded", "failed", "cancelled", "expired", "refused"), 0)
    for ref in rec.lines:
        tally[outcome(ref, tasks.get(ref.task_id) if ref.task_id else None, rec)] += 1
    if rec.api == "anthropic":
        return {"processing": tally["open"], "succeeded": tally["succeeded"],
                "errored": tally["failed"] + tally["refused"], "canceled": tally["cancelled"],
                "expired": tally["expired"]}
    return {"total": len(rec.lines), "completed": tally["succeeded"],
            "failed": tally["failed"] + tally["refused"] + tally["cancelled"] + tally["expired"]}


def all_ended(rec: BatchRecord, tasks: Mapping[str, TaskRecord | None]) -> bool:
    return all(outcome(ref, tasks.get(ref.task_id) if ref.task_id else None, rec) != "open" for ref in rec.lines)


# -- output files ---------------------------------------------------------------------------------
def _jsonl(rows: Sequence[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in rows)


_NO_ANSWER = {"cancelled": ("batch_cancelled", "the batch was cancelled before this request ran"),
              "expired": ("batch_expired", "the batch's completion window ended before this request ran")}


def openai_files(rec: BatchRecord, tasks: Mapping[str, TaskRecord | None]) -> tuple[bytes, bytes]:
    """(output JSONL, error JSONL) as OpenAI documents them: a request that got an answer has
    `response` (status_code, request_id, body); one that got none has `error` (code, message)."""
    out: list[dict[str, Any]] = []
    err: list[dict[str, Any]] = []
    for ref in rec.lines:
        task = tasks.get(ref.task_id) if ref.task_id else None
        kind = outcome(ref, task, rec)
        line_id = f"batch_req_{ref.task_id or f'{rec.id}-{ref.index}'}"
        if kind in ("succeeded", "failed") and task is not None and task.http_status is not None:
            row = {"id": line_id, "custom_id": ref.custom_id,
                   "response": {"status_code": task.http_status, "request_id": task.id, "body": _body(task.result)},
                   "error": None}
            (out if kind == "succeeded" else err).append(row)
            continue
        if kind == "refused":
            code, message = ref.error_code or "invalid_request", ref.error_message or "invalid request"
        elif kind in _NO_ANSWER:
            code, message = _NO_ANSWER[kind]
        else:  # failed without an HTTP answer, or its task is gone
            code = "request_failed"
            message = (task.error if task is not None else None) or "the request could not be run"
        err.append({"id": line_id, "custom_id": ref.custom_id, "response": None,
                    "error": {"code": code, "message": message, "line": ref.index}})
    return _jsonl(out), _jsonl(err)


def _anthropic_error(status: int | None, body: Any, message: str) -> dict[str, Any]:
    if isinstance(body, dict) and body.get("type") == "error" and isinstance(body.get("error"), dict):
        return body  # already Anthropic's error body (the line ran on the Messages API)
    kind = "invalid_request_error" if status is not None and 400 <= status < 500 else "api_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_results(rec: BatchRecord, tasks: Mapping[str, TaskRecord | None]) -> bytes:
    """One line per request, in the order given: `{"custom_id", "result": {"type": ...}}`."""
    rows: list[dict[str, Any]] = []
    for ref in rec.lines:
        task = tasks.get(ref.task_id) if ref.task_id else None
        kind = outcome(ref, task, rec)
        result: dict[str, Any]
        if kind == "succeeded" and task is not None:
            result = {"type": "succeeded", "message": _body(task.result)}
        elif kind == "cancelled":
            result = {"type": "canceled"}
        elif kind == "expired":
            result = {"type": "expired"}
        else:
            status = 400 if kind == "refused" else task.http_status if task is not None else None
            body = _body(task.result) if task is not None else None
            message = ref.error_message or (task.error if task is not None else None) or "the request failed"
            result = {"type": "errored", "error": _anthropic_error(status, body, message)}
        rows.append({"custom_id": ref.custom_id, "result": result})
    return _jsonl(rows)


def finish(rec: BatchRecord, now: float, output_id: str | None, error_id: str | None, results_id: str | None,
           final_counts: dict[str, int]) -> BatchRecord | None:
    """The batch ended: its files and counts; None when it already had (another finalizer won)."""
    if not rec.open:
        return None
    status = {"in_progress": "completed", "cancelling": "cancelled"}[rec.status]
    if rec.expired_at is not None:
        status = "expired"
    return dataclasses.replace(rec, status=status, finalizing_at=rec.finalizing_at or now, output_file_id=output_id,
                               error_file_id=error_id, results_file_id=results_id, counts=final_counts,
                               completed_at=now if status == "completed" else None,
                               cancelled_at=now if status == "cancelled" else None)


def cancelling(rec: BatchRecord, now: float) -> BatchRecord | None:
    if rec.status != "in_progress":
        return None
    return dataclasses.replace(rec, status="cancelling", cancelling_at=now)


def expiring(rec: BatchRecord, now: float) -> BatchRecord | None:
    if not rec.open or now < rec.expires_at or rec.expired_at is not None:
        return None
    return dataclasses.replace(rec, expired_at=now)


# -- views ------------------------------------------------------------------------------------------
def _ts(t: float | None) -> int | None:
    return int(t) if t is not None else None


def openai_view(rec: BatchRecord, request_counts: dict[str, int]) -> dict[str, Any]:
    """OpenAI's batch object."""
    status = "finalizing" if rec.open and rec.finalizing_at else rec.status
    return {"id": rec.id, "object": "batch", "endpoint": rec.endpoint, "errors": None,
            "input_file_id": rec.input_file_id, "completion_window": rec.completion_window, "status": status,
            "output_file_id": rec.output_file_id, "error_file_id": rec.error_file_id,
            "created_at": int(rec.created_at), "in_progress_at": int(rec.created_at),
            "expires_at": int(rec.expires_at), "finalizing_at": _ts(rec.finalizing_at),
            "completed_at": _ts(rec.completed_at), "failed_at": None, "expired_at": _ts(rec.expired_at),
            "cancelling_at": _ts(rec.cancelling_at), "cancelled_at": _ts(rec.cancelled_at),
            "request_counts": request_counts, "metadata": rec.metadata}


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat().replace("+00:00", "Z")


def anthropic_view(rec: BatchRecord, request_counts: dict[str, int], results_url: str | None) -> dict[str, Any]:
    """Anthropic's message batch."""
    processing = {"in_progress": "in_progress", "cancelling": "canceling"}.get(rec.status, "ended")
    ended = rec.completed_at or rec.cancelled_at or (rec.finalizing_at if processing == "ended" else None)
    return {"id": rec.id, "type": "message_batch", "processing_status": processing,
            "request_counts": request_counts, "ended_at": rfc3339(ended), "created_at": rfc3339(rec.created_at),
            "expires_at": rfc3339(rec.expires_at), "archived_at": None, "cancel_initiated_at": rfc3339(rec.cancelling_at),
            "results_url": results_url if processing == "ended" else None}


# -- serialization ------------------------------------------------------------------------------------
def to_doc(rec: BatchRecord) -> bytes:
    return orjson.dumps(dataclasses.asdict(rec))


def from_doc(doc: bytes | str) -> BatchRecord:
    d = orjson.loads(doc)
    d["lines"] = tuple(LineRef(**ln) for ln in d["lines"])
    return BatchRecord(**d)
