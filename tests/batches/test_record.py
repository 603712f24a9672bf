"""A batch's record, pure: counts, output and error files as OpenAI documents them, Anthropic's
results, and the views each API answers."""

from __future__ import annotations

import dataclasses

import orjson

from extproc.batches import record
from extproc.batches.lines import LineRef
from extproc.batches.record import BatchRecord
from extproc.tasks.state import StoredRequest, TaskRecord

_REQ = StoredRequest("POST", "/v1/chat/completions", (), b"{}")


def _task(tid: str, status: str, http: int | None = None, body: object = None, error: str | None = None) -> TaskRecord:
    return TaskRecord(id=tid, tenant="t", protocol="openai", request=_REQ, status=status,  # type: ignore[arg-type]
                      http_status=http, result=orjson.dumps(body) if body is not None else None, error=error)


def _batch(api: str = "openai", **over: object) -> BatchRecord:
    lines = (LineRef(1, "ok", "b-1"), LineRef(2, None, None, "invalid_json_line", "line 2 is not valid JSON"),
             LineRef(3, "bad", "b-3"), LineRef(4, "lost", "b-4"), LineRef(5, "wait", "b-5"))
    return BatchRecord(id="b", tenant="t", api=api, endpoint="/v1/chat/completions",  # type: ignore[arg-type]
                       created_at=1000.0, expires_at=1000.0 + 86400, lines=lines, **over)  # type: ignore[arg-type]


TASKS = {"b-1": _task("b-1", "succeeded", 200, {"id": "chatcmpl-1"}),
         "b-3": _task("b-3", "failed", 404, {"error": {"message": "no model", "type": "not_found_error"}}),
         "b-4": _task("b-4", "failed", error="no answer within 600s"),
         "b-5": _task("b-5", "running")}


def test_counts_in_each_apis_terms_and_the_end_waits_for_every_line() -> None:
    assert record.counts(_batch(), TASKS) == {"total": 5, "completed": 1, "failed": 3}
    assert record.counts(_batch("anthropic"), TASKS) == {"processing": 1, "succeeded": 1, "errored": 3,
                                                         "canceled": 0, "expired": 0}
    assert not record.all_ended(_batch(), TASKS)
    assert record.all_ended(_batch(), {**TASKS, "b-5": _task("b-5", "cancelled")})


def test_output_and_error_files_are_openais_lines() -> None:
    tasks = {**TASKS, "b-5": _task("b-5", "cancelled")}
    out, err = record.openai_files(_batch(), tasks)
    assert [orjson.loads(x) for x in out.splitlines()] == [
        {"id": "batch_req_b-1", "custom_id": "ok", "error": None,
         "response": {"status_code": 200, "request_id": "b-1", "body": {"id": "chatcmpl-1"}}}]
    rows = [orjson.loads(x) for x in err.splitlines()]
    assert [(r["custom_id"], r["response"] and r["response"]["status_code"], r["error"] and r["error"]["code"])
            for r in rows] == [(None, None, "invalid_json_line"), ("bad", 404, None), ("lost", None, "request_failed"),
                               ("wait", None, "batch_cancelled")]
    assert rows[2]["error"]["message"] == "no answer within 600s" and rows[0]["error"]["line"] == 2


def test_anthropic_results_keep_the_order_and_anthropics_error_shape() -> None:
    rec = _batch("anthropic")
    tasks = {**TASKS, "b-3": _task("b-3", "failed", 404, {"type": "error", "error": {"type": "not_found_error",
                                                                                      "message": "no model"}}),
             "b-5": _task("b-5", "cancelled")}
    rows = [orjson.loads(x) for x in record.anthropic_results(rec, tasks).splitlines()]
    assert [r["result"]["type"] for r in rows] == ["succeeded", "errored", "errored", "errored", "canceled"]
    assert rows[2]["result"]["error"] == {"type": "error", "error": {"type": "not_found_error", "message": "no model"}}
    assert rows[1]["result"]["error"]["error"]["type"] == "invalid_request_error"
    assert rows[3]["result"]["error"]["error"] == {"type": "api_error", "message": "no answer within 600s"}


def test_the_ends_of_a_batch() -> None:
    rec = _batch()
    done = record.finish(rec, 2000.0, "file-o", "file-e", None, {"total": 5, "completed": 1, "failed": 4})
    assert done is not None and done.status == "completed" and done.completed_at == 2000.0 and not done.open
    assert record.finish(done, 2001.0, None, None, None, {}) is None  # another finalizer already closed it
    cancelling = record.cancelling(rec, 1500.0)
    assert cancelling is not None and cancelling.status == "cancelling"
    cancelled = record.finish(cancelling, 1600.0, None, "file-e", None, {})
    assert cancelled is not None and cancelled.status == "cancelled" and cancelled.cancelled_at == 1600.0
    assert record.expiring(rec, 1500.0) is None
    expiring = record.expiring(rec, rec.expires_at + 1)
    assert expiring is not None
    expired = record.finish(expiring, rec.expires_at + 2, None, None, None, {})
    assert expired is not None and expired.status == "expired"
    assert record.outcome(rec.lines[4], _task("b-5", "cancelled"), expiring) == "expired"


def test_views_and_the_stored_document() -> None:
    rec = dataclasses.replace(_batch(), metadata={"k": "v"})
    view = record.openai_view(rec, {"total": 5, "completed": 1, "failed": 3})
    assert view["object"] == "batch" and view["status"] == "in_progress" and view["expires_at"] == 1000 + 86400
    assert view["metadata"] == {"k": "v"} and view["request_counts"]["total"] == 5
    a = record.anthropic_view(dataclasses.replace(rec, api="anthropic"), {}, "http://gw/results")
    assert a["processing_status"] == "in_progress" and a["results_url"] is None
    assert a["created_at"] == "1970-01-01T00:16:40Z"
    assert record.from_doc(record.to_doc(rec)) == rec
