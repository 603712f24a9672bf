"""The task state machine, pure: transitions, the one retry, and what is stored of a request."""

from __future__ import annotations

import pytest

from extproc.tasks import state
from extproc.tasks.marker import ReplayMarker
from extproc.tasks.state import StoredRequest

REQ = StoredRequest("POST", "/v1/messages", (("content-type", "application/json"),), b'{"x":1}')


def _new(now: float = 100.0) -> state.TaskRecord:
    return state.new_task("t1", "acme", "anthropic", REQ, now)


def test_claim_run_complete() -> None:
    rec = state.claim(_new(), 101.0, "w1", 30.0)
    assert (rec.status, rec.attempts, rec.retried, rec.owner, rec.lease_until) == ("running", 1, False, "w1", 131.0)
    assert state.claim(rec, 102.0, "w2", 30.0) is rec  # leased: nobody else takes it
    assert state.renew(rec, 110.0, "w2", 30.0) is None
    rec = state.renew(rec, 110.0, "w1", 30.0)
    assert rec is not None and rec.lease_until == 140.0
    assert state.complete(rec, 111.0, "w2", 200, b"{}") is None  # only the owner completes
    done = state.complete(rec, 111.0, "w1", 200, b'{"ok":true}')
    assert done is not None and done.status == "succeeded" and done.completed_at == 111.0
    assert state.public_view(done)["result"] == {"ok": True}
    failed = state.complete(rec, 111.0, "w1", 429, b'{"error":{"type":"rate_limit_error"}}')
    assert failed is not None and failed.status == "failed"
    assert state.public_view(failed)["error"] == {"status": 429, "body": {"error": {"type": "rate_limit_error"}}}


def test_an_interrupted_run_is_retried_once_then_fails() -> None:
    rec = state.claim(_new(), 100.0, "w1", 10.0)
    assert not state.claimable(rec, 105.0) and state.claimable(rec, 111.0)
    retry = state.claim(rec, 111.0, "w2", 10.0)
    assert (retry.status, retry.attempts, retry.retried, retry.owner) == ("running", 2, True, "w2")
    gave_up = state.claim(retry, 122.0, "w3", 10.0)
    assert gave_up.status == "failed" and "interrupted twice" in (gave_up.error or "")
    assert state.public_view(gave_up)["error"]["status"] is None


def test_release_does_not_count_and_requeue_does() -> None:
    rec = state.claim(_new(), 100.0, "w1", 10.0)
    back = state.release(rec, "w1")
    assert back is not None and (back.status, back.attempts, back.retried) == ("queued", 0, False)
    again = state.requeue(rec, "w1")
    assert again is not None and (again.status, again.attempts, again.retried) == ("queued", 1, True)
    second = state.claim(again, 101.0, "w1", 10.0)
    assert (second.attempts, second.retried) == (2, True)
    lost_again = state.requeue(second, "w1")
    assert lost_again is not None and state.claim(lost_again, 102.0, "w1", 10.0).status == "failed"


def test_cancel_is_final_and_sticks() -> None:
    running = state.claim(_new(), 100.0, "w1", 10.0)
    cancelled = state.cancel(running, 101.0)
    assert cancelled.status == "cancelled" and cancelled.final
    assert state.complete(cancelled, 102.0, "w1", 200, b"{}") is None  # a late answer does not revive it
    assert state.claim(cancelled, 200.0, "w1", 10.0) is cancelled
    done = state.complete(running, 102.0, "w1", 200, b"{}")
    assert done is not None and state.cancel(done, 103.0) is done
    assert state.expired(cancelled, 101.0 + 60, 30.0) and not state.expired(running, 1e9, 30.0)


@pytest.mark.parametrize(("prefer", "want"), [
    ("respond-async", True), ("wait=10, respond-async", True), ("Respond-Async; x=1", True),
    ("return=minimal", False), ("", False), (None, False), ("respond-asynchronously", False)])
def test_prefers_async(prefer: str | None, want: bool) -> None:
    assert state.prefers_async(prefer) is want


def test_stored_request_keeps_no_credentials() -> None:
    headers = {":method": "POST", ":path": "/x?key=s3cret&alt=json", "authorization": "Bearer sk-1",
               "x-api-key": "sk-2", "x-goog-api-key": "sk-3", "prefer": "respond-async", "host": "gw",
               "content-length": "7", "x-modelyard-callback-url": "http://h", "x-modelyard-cluster": "c",
               "x-modelyard-channel": "fast", "anthropic-version": "2023-06-01", "content-type": "application/json"}
    req = state.stored_request("POST", "/x", "key=s3cret&alt=json", headers, b"{}")
    assert req.path == "/x?alt=json"
    assert dict(req.headers) == {"x-modelyard-channel": "fast", "anthropic-version": "2023-06-01",
                                 "content-type": "application/json"}


def test_records_round_trip_through_bytes() -> None:
    rec = state.complete(state.claim(_new(), 1.0, "w", 5.0), 2.0, "w", 200, b"\x00\xffbin")
    assert rec is not None and state.from_doc(state.to_doc(rec), REQ.body, rec.result) == rec
    assert b"bin" not in state.to_doc(rec) and REQ.body not in state.to_doc(rec)


def test_marker_only_from_the_key_that_made_it() -> None:
    m = ReplayMarker(b"k" * 32)
    value = m.sign("abc123", "tenant:with:colons")
    assert m.verify(value) == ("abc123", "tenant:with:colons")
    assert ReplayMarker(b"j" * 32).verify(value) is None
    assert m.verify(value.replace("abc123", "abc124")) is None
    assert m.verify(value[:-1] + ("0" if value[-1] != "0" else "1")) is None
    for junk in (None, "", "v1", "v1:::", "v2:abc123:t:" + value.rsplit(":", 1)[1]):
        assert m.verify(junk) is None
