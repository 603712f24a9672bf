"""The task state machine, pure: records, transitions and what a caller sees of them.

queued -> running -> succeeded | failed; queued | running -> cancelled. A running task whose
lease expired was interrupted (its extproc died): it goes back to running once more, marked
`retried`; interrupted again, it fails. Stores apply these functions inside their transactions.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from adapters.registry import PROTOCOLS

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
FINAL: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
# The first run and the one retry after an interruption.
MAX_ATTEMPTS = 2

# Headers that never travel with a stored request: credentials (the replay is authenticated by its
# marker), hop-by-hop ones, the async preference itself, and anything under the gateway's prefix;
# accept-encoding too: the result is stored as identity, and each poll negotiates its own coding.
_DROP_HEADERS = frozenset({*(h for p in PROTOCOLS.values() for h in p.CLIENT_AUTH_HEADERS),
                           "authorization", "x-api-key", "x-goog-api-key", "api-key", "host", "content-length",
                           "transfer-encoding", "connection", "keep-alive", "te", "upgrade", "prefer",
                           "expect", "proxy-authorization", "cookie", "accept-encoding"})
_KEPT_PREFIXED = frozenset({"x-modelyard-strategy", "x-modelyard-channel"})
CALLBACK_HEADER = "x-modelyard-callback-url"


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """The caller's request as the worker replays it: no credential, no async preference."""

    method: str
    path: str  # with the query, less any `key=`
    headers: tuple[tuple[str, str], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class TaskRecord:
    id: str
    tenant: str
    protocol: str
    request: StoredRequest
    status: Status = "queued"
    created_at: float = 0.0
    started_at: float | None = None
    completed_at: float | None = None
    attempts: int = 0
    retried: bool = False
    owner: str = ""
    lease_until: float = 0.0
    http_status: int | None = None
    result: bytes | None = None  # the body the caller would have got synchronously
    # The answer's headers that give its body meaning (content-type; KServe's binary header length)
    result_headers: tuple[tuple[str, str], ...] = ()
    error: str | None = None  # why the gateway could not run it (no HTTP answer at all)
    callback_url: str | None = None
    notified: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.status in FINAL


def new_task(task_id: str, tenant: str, protocol: str, request: StoredRequest, now: float,
             callback_url: str | None = None) -> TaskRecord:
    return TaskRecord(id=task_id, tenant=tenant, protocol=protocol, request=request, created_at=now,
                      callback_url=callback_url)


def claimable(rec: TaskRecord, now: float) -> bool:
    """Queued, or running under a lease nobody renewed (its runner is gone)."""
    return rec.status == "queued" or (rec.status == "running" and rec.lease_until < now)


def claim(rec: TaskRecord, now: float, owner: str, lease_s: float) -> TaskRecord:
    """`rec` taken by `owner`: running under a fresh lease, or failed when interrupted twice."""
    if not claimable(rec, now):
        return rec
    retried = rec.retried
    if rec.status == "running" or rec.attempts >= MAX_ATTEMPTS:
        if rec.attempts >= MAX_ATTEMPTS:
            return dataclasses.replace(rec, status="failed", completed_at=now, owner="", lease_until=0.0,
                                       error="interrupted twice while running; not retried again")
        retried = True
    return dataclasses.replace(rec, status="running", attempts=rec.attempts + 1, retried=retried, owner=owner,
                               started_at=rec.started_at or now, lease_until=now + lease_s)


def renew(rec: TaskRecord, now: float, owner: str, lease_s: float) -> TaskRecord | None:
    """A longer lease for the runner that holds it; None when it no longer does (cancelled, taken)."""
    if rec.status != "running" or rec.owner != owner:
        return None
    return dataclasses.replace(rec, lease_until=now + lease_s)


def complete(rec: TaskRecord, now: float, owner: str, http_status: int | None, body: bytes | None,
             error: str | None = None, headers: tuple[tuple[str, str], ...] = ()) -> TaskRecord | None:
    """The replay's answer: a 2xx succeeds, anything else fails with the body as the caller's error."""
    if rec.status != "running" or rec.owner != owner:
        return None  # cancelled meanwhile, or another runner took it over: its outcome stands
    ok = http_status is not None and 200 <= http_status < 300
    return dataclasses.replace(rec, status="succeeded" if ok else "failed", completed_at=now, owner="",
                               lease_until=0.0, http_status=http_status, result=body, error=error,
                               result_headers=headers)


def release(rec: TaskRecord, owner: str) -> TaskRecord | None:
    """Back to the queue without counting the attempt: the replay never reached the gateway."""
    if rec.status != "running" or rec.owner != owner:
        return None
    started = rec.started_at if rec.attempts > 1 else None
    return dataclasses.replace(rec, status="queued", attempts=rec.attempts - 1, owner="", lease_until=0.0,
                               started_at=started)


def requeue(rec: TaskRecord, owner: str) -> TaskRecord | None:
    """The replay reached the gateway but no answer of the gateway's came back (it died under the
    request): the attempt counts, and the next one is the marked retry."""
    if rec.status != "running" or rec.owner != owner:
        return None
    return dataclasses.replace(rec, status="queued", retried=True, owner="", lease_until=0.0)


def owes_webhook(rec: TaskRecord) -> bool:
    """Ended, asked for a webhook, and no receiver has taken it yet."""
    return rec.final and bool(rec.callback_url) and not rec.notified


def mark_notified(rec: TaskRecord) -> TaskRecord:
    return dataclasses.replace(rec, notified=True)


def cancel(rec: TaskRecord, now: float) -> TaskRecord:
    if rec.final:
        return rec
    return dataclasses.replace(rec, status="cancelled", completed_at=now, owner="", lease_until=0.0)


def expired(rec: TaskRecord, now: float, ttl_s: float) -> bool:
    return rec.final and rec.completed_at is not None and rec.completed_at + ttl_s < now


# The answer headers a task keeps: what a client needs to read the stored body as the synchronous answer.
RESULT_HEADERS = ("content-type", "inference-header-content-length")


def _json_or_text(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None  # binary: the exact bytes are at `result_url` and in `result_base64`


def _result_fields(rec: TaskRecord, body: bytes) -> dict[str, Any]:
    """A body JSON cannot hold as it is (KServe binary tensors) also comes as base64, with its headers."""
    if _json_or_text(body) is not None:
        return {}
    return {"result_base64": base64.b64encode(body).decode(), "result_headers": dict(rec.result_headers),
            "result_url": f"/v1/tasks/{rec.id}/result"}


def public_view(rec: TaskRecord) -> dict[str, Any]:
    """What `GET /v1/tasks/{id}` answers (and the webhook posts)."""
    result: Any = None
    error: Any = None
    extra: dict[str, Any] = {}
    if rec.status == "succeeded" and rec.result is not None:
        result = _json_or_text(rec.result)
        extra = _result_fields(rec, rec.result)
    elif rec.status == "failed":
        if rec.result is not None:  # the error body in the caller's protocol, as a synchronous call got it
            error = {"status": rec.http_status, "body": _json_or_text(rec.result)}
        else:
            error = {"status": None, "message": rec.error or "the task failed"}
    return {"id": rec.id, "object": "task", "status": rec.status, "created_at": int(rec.created_at),
            "started_at": int(rec.started_at) if rec.started_at else None,
            "completed_at": int(rec.completed_at) if rec.completed_at else None,
            "attempts": rec.attempts, "retried": rec.retried, "result": result, "error": error, **extra}


def accepted_view(rec: TaskRecord) -> dict[str, Any]:
    """The 202's body."""
    return {"id": rec.id, "object": "task", "status": rec.status, "created_at": int(rec.created_at)}


def prefers_async(prefer: str | None) -> bool:
    """RFC 7240: `Prefer: respond-async` among comma-separated preferences (parameters ignored)."""
    if not prefer:
        return False
    return any(p.split(";", 1)[0].strip().lower() == "respond-async" for p in prefer.split(","))


def stored_request(method: str, path: str, query: str, headers: dict[str, str], body: bytes) -> StoredRequest:
    """The request to replay, without anything that authenticates the caller."""
    kept = tuple((k, v) for k, v in headers.items()
                 if not k.startswith(":") and k not in _DROP_HEADERS and k != CALLBACK_HEADER
                 and (not k.startswith("x-modelyard-") or k in _KEPT_PREFIXED))
    params = [p for p in query.split("&") if p and p.split("=", 1)[0] != "key"] if query else []
    return StoredRequest(method, path + ("?" + "&".join(params) if params else ""), kept, body)


# -- serialization ---------------------------------------------------------------------------------
# Stores keep a small JSON document per task and the request body and result as raw blobs beside it:
# a lease renewal rewrites the document, never a large body, and a poll never reads the body.
def to_doc(rec: TaskRecord) -> bytes:
    d = dataclasses.asdict(rec)
    del d["request"]["body"], d["result"]
    return orjson.dumps(d)


def from_doc(doc: bytes | str, body: bytes | None = None, result: bytes | None = None) -> TaskRecord:
    """`body` None: a record read without its request body (polls, transitions)."""
    d = orjson.loads(doc)
    r = d.pop("request")
    req = StoredRequest(r["method"], r["path"], tuple((k, v) for k, v in r["headers"]), body or b"")
    d["result_headers"] = tuple((k, v) for k, v in d.get("result_headers", ()))  # older docs have none
    return TaskRecord(request=req, result=result, **d)
