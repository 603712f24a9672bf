"""A batch passed through to a provider's own batch API (a deployment with `batch: {mode: native}`;
docs/batches.md "Native batches"), pure: each line's body for the provider (translated where the
caller's protocol is not the deployment's), the provider's input (OpenAI's JSONL file, Anthropic's
`requests`), its status, and its results as each line's outcome in the caller's protocol.

The provider sees custom ids of the gateway's making (`line-<n>`): a caller's custom_id (OpenAI's
may be 512 characters of anything) never needs to satisfy the other provider's rules, and results
map back by line, not by a caller-chosen string.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import orjson

from adapters import anthropic, gemini, openai
from adapters.internal import Usage
from contracts.errors import ModelyardError
from extproc.batches.record import BatchRecord
from extproc.tasks import state as task_state
from extproc.tasks.state import StoredRequest, TaskRecord

# bedrock: Bedrock batch inference, each record's modelInput in the model's native body (Anthropic's
# Messages on Bedrock for the Claude models, the only family run natively there so far).
# vertex: Vertex AI batch prediction, each line `{"request": <Gemini's generateContent body>}`.
Protocol = Literal["openai", "anthropic", "bedrock", "vertex", "gemini"]
ADAPTERS: dict[str, ModuleType] = {"openai": openai, "anthropic": anthropic, "gemini": gemini}
OPENAI_PATH = "/v1/chat/completions"
ANTHROPIC_VERSION = "2023-06-01"
# Provider batch states that mean "no more results will come".
OPENAI_ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
BEDROCK_ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
VERTEX_ENDED = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_PARTIALLY_SUCCEEDED", "JOB_STATE_FAILED",
                          "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"})
VERTEX_LINE_LABEL = "modelyard_line"  # Gemini's request labels come back with each prediction: the line
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"  # InvokeModel's body for Claude names this, not a header


@dataclass(frozen=True, slots=True)
class NativeTarget:
    """Where a batch runs whole: a model's deployment with its own batch API."""

    model: str
    cluster: str
    protocol: Protocol
    upstream_model: str


@dataclass(frozen=True, slots=True)
class LineResult:
    """One line's outcome as the provider reported it, already in the caller's protocol."""

    kind: Literal["succeeded", "failed", "cancelled"]
    status: int | None = None  # the HTTP status of its answer, None when it got none
    body: bytes | None = None  # the answer (or error body) in the caller's protocol
    usage: Usage | None = None  # what the provider billed, read from its own answer
    error: str | None = None  # why there is no answer


def caller_protocol(api: str) -> Protocol:
    return "anthropic" if api == "anthropic" else "openai"


def upstream_id(index: int) -> str:
    return f"line-{index}"


def bedrock_record_id(index: int) -> str:
    """Bedrock's recordId: 11 alphanumeric characters."""
    return f"L{index:010d}"


def bedrock_native(upstream_model: str) -> bool:
    """A Bedrock model whose batch records the gateway can write: Anthropic's Claude (InvokeModel's
    Messages body); other families' bodies differ model by model, so their batches are replayed."""
    return "anthropic.claude" in upstream_model  # a model id, or a cross-region profile (us.anthropic.claude-...)


def _wire(target: NativeTarget) -> NativeTarget:
    """The protocol each line's body is written in: a Bedrock Claude record holds Anthropic's Messages,
    a Vertex batch line Gemini's generateContent."""
    wire = {"bedrock": "anthropic", "vertex": "gemini"}.get(target.protocol)
    return dataclasses.replace(target, protocol=wire) if wire else target  # type: ignore[arg-type]


def render_line(api: str, target: NativeTarget, body: bytes) -> dict[str, Any]:
    """The line's request as the provider's batch API takes it (ModelyardError: not translatable)."""
    if target.protocol == "bedrock":
        obj = render_line(api, _wire(target), body)
        obj.pop("model", None)  # the job names the model; InvokeModel's body does not
        obj.pop("stream", None)
        return {"anthropic_version": BEDROCK_ANTHROPIC_VERSION, **obj}
    if target.protocol == "vertex":
        caller = caller_protocol(api)
        req = ADAPTERS[caller].parse_request(body)
        return orjson.loads(gemini.render_request(req, upstream_model=target.upstream_model, credential=None).body)
    caller = caller_protocol(api)
    if caller == target.protocol:
        obj = orjson.loads(body)
        obj["model"] = target.upstream_model
        return obj
    req = ADAPTERS[caller].parse_request(body)
    out = ADAPTERS[target.protocol].render_request(req, upstream_model=target.upstream_model, credential=None)
    return orjson.loads(out.body)


def openai_input(lines: Iterable[tuple[int, dict[str, Any]]]) -> bytes:
    """OpenAI's batch input file for `/v1/chat/completions`."""
    return b"".join(orjson.dumps({"custom_id": upstream_id(i), "method": "POST", "url": OPENAI_PATH, "body": b})
                    + b"\n" for i, b in lines)


def bedrock_input(lines: Iterable[tuple[int, dict[str, Any]]]) -> bytes:
    """Bedrock's batch input file: one `{recordId, modelInput}` a line."""
    return b"".join(orjson.dumps({"recordId": bedrock_record_id(i), "modelInput": b}) + b"\n" for i, b in lines)


def vertex_input(lines: Iterable[tuple[int, dict[str, Any]]]) -> bytes:
    """Vertex's batch input file: one `{"request": ...}` a line, its line number in the request's labels."""
    return b"".join(orjson.dumps({"request": {**b, "labels": {**(b.get("labels") or {}), VERTEX_LINE_LABEL: str(i)}}})
                    + b"\n" for i, b in lines)


def anthropic_input(lines: Iterable[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    return {"requests": [{"custom_id": upstream_id(i), "params": b} for i, b in lines]}


def ended(protocol: Protocol, batch: Any) -> bool:
    if not isinstance(batch, dict):
        return False
    if protocol == "openai":
        return batch.get("status") in OPENAI_ENDED
    if protocol == "bedrock":
        return batch.get("status") in BEDROCK_ENDED
    if protocol == "vertex":
        return batch.get("state") in VERTEX_ENDED
    return batch.get("processing_status") == "ended"


def _answer(api: str, target: NativeTarget, status: int, body: Any) -> LineResult:
    """A provider's answer to one line, in the caller's protocol, with the usage it billed."""
    raw = orjson.dumps(body)
    caller = caller_protocol(api)
    if not 200 <= status < 300:
        if caller != target.protocol:  # the provider's error, told in the caller's error shape
            message = body.get("error", {}).get("message") if isinstance(body, dict) else None
            raw = ADAPTERS[caller].render_error(status, str(message or "the provider refused this request"), None)
        return LineResult("failed", status, raw)
    try:
        resp = ADAPTERS[target.protocol].parse_response(raw)
    except ModelyardError as e:
        return LineResult("failed", 502, ADAPTERS[caller].render_error(502, e.message, None))
    if caller == target.protocol:
        if isinstance(body, dict):
            body["model"] = target.model  # the gateway's name, as a synchronous call answers
        return LineResult("succeeded", status, orjson.dumps(body), resp.usage)
    return LineResult("succeeded", status, ADAPTERS[caller].render_response(resp, model=target.model), resp.usage)


def _index(custom_id: Any) -> int | None:
    if isinstance(custom_id, str) and custom_id.startswith("line-") and custom_id[5:].isdigit():
        return int(custom_id[5:])
    return None


def _jsonl(data: bytes) -> list[Any]:
    out = []
    for raw in data.splitlines():
        if raw.strip():
            try:
                out.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue  # a line the provider garbled: that request ends failed (no result)
    return out


def openai_results(api: str, target: NativeTarget, output: bytes, errors: bytes) -> dict[int, LineResult]:
    """OpenAI's output and error files, by line."""
    out: dict[int, LineResult] = {}
    for row in _jsonl(output) + _jsonl(errors):
        i = _index(row.get("custom_id")) if isinstance(row, dict) else None
        if i is None:
            continue
        resp, err = row.get("response"), row.get("error")
        if isinstance(resp, dict) and isinstance(resp.get("status_code"), int):
            out[i] = _answer(api, target, resp["status_code"], resp.get("body"))
        else:
            code = err.get("code") if isinstance(err, dict) else None
            message = err.get("message") if isinstance(err, dict) else None
            kind: Literal["failed", "cancelled"] = "cancelled" if code in ("batch_cancelled", "batch_expired") \
                else "failed"
            out[i] = LineResult(kind, error=str(message or code or "the provider ran no request"))
    return out


_ERROR_STATUS = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
                 "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
                 "api_error": 500, "overloaded_error": 529}


def anthropic_results(api: str, target: NativeTarget, results: bytes) -> dict[int, LineResult]:
    """Anthropic's results JSONL, by line."""
    out: dict[int, LineResult] = {}
    for row in _jsonl(results):
        i = _index(row.get("custom_id")) if isinstance(row, dict) else None
        result = row.get("result") if isinstance(row, dict) else None
        if i is None or not isinstance(result, dict):
            continue
        kind = result.get("type")
        if kind == "succeeded":
            out[i] = _answer(api, target, 200, result.get("message"))
        elif kind == "errored":
            body = result.get("error")
            inner = body.get("error") if isinstance(body, dict) else None
            status = _ERROR_STATUS.get(str(inner.get("type")), 500) if isinstance(inner, dict) else 500
            out[i] = _answer(api, target, status, body)
        else:  # canceled, expired
            out[i] = LineResult("cancelled", error=f"the provider's batch {kind} before this request ran")
    return out


def bedrock_results(api: str, target: NativeTarget, output: bytes, status: str,
                    indexes: Iterable[int]) -> dict[int, LineResult]:
    """Bedrock's `.jsonl.out` records, by line: `modelOutput` (Claude's message) or `error`. A job
    stopped or expired before a record ran leaves it without one: that line was cancelled."""
    wire = _wire(target)
    out: dict[int, LineResult] = {}
    for row in _jsonl(output):
        rid = row.get("recordId") if isinstance(row, dict) else None
        if not (isinstance(rid, str) and len(rid) == 11 and rid[0] == "L" and rid[1:].isdigit()):
            continue
        i, answer, err = int(rid[1:]), row.get("modelOutput"), row.get("error")
        if isinstance(answer, dict) and answer.get("type") != "error":
            answer.setdefault("model", target.upstream_model)  # Bedrock's Claude answer may omit it
            out[i] = _answer(api, wire, 200, answer)
        else:
            if isinstance(answer, dict):  # Claude's own error body
                inner = answer.get("error")
                code, message = (inner.get("type"), inner.get("message")) if isinstance(inner, dict) else (None, None)
            else:
                code = err.get("errorCode") if isinstance(err, dict) else None
                message = err.get("errorMessage") if isinstance(err, dict) else None
            status_code = code if isinstance(code, int) else _ERROR_STATUS.get(str(code), 400)
            body = {"type": "error", "error": {"type": "invalid_request_error" if status_code < 500 else "api_error",
                                               "message": str(message or "Bedrock refused this record")}}
            out[i] = _answer(api, wire, status_code if 400 <= status_code < 600 else 400, body)
    if status in ("Stopped", "Expired"):
        for i in indexes:
            out.setdefault(i, LineResult("cancelled", error=f"the provider's batch job {status.lower()} "
                                                            "before this request ran"))
    return out


def vertex_results(api: str, target: NativeTarget, output: bytes, state: str,
                   indexes: Iterable[int]) -> dict[int, LineResult]:
    """Vertex's predictions JSONL, by line (the label the gateway put in each request): `response`
    (Gemini's generateContent answer), else `status` (why it failed). A job cancelled or expired
    before a line ran leaves it without one: that line was cancelled."""
    wire = _wire(target)
    out: dict[int, LineResult] = {}
    for row in _jsonl(output):
        req = row.get("request") if isinstance(row, dict) else None
        labels = req.get("labels") if isinstance(req, dict) else None
        line = labels.get(VERTEX_LINE_LABEL) if isinstance(labels, dict) else None
        if not (isinstance(line, str) and line.isdigit()):
            continue
        answer, status = row.get("response"), row.get("status")
        if isinstance(answer, dict) and not status:
            out[int(line)] = _answer(api, wire, 200, answer)
        else:
            body = {"error": {"code": 400, "message": str(status or "Vertex returned no prediction"),
                              "status": "INVALID_ARGUMENT"}}
            out[int(line)] = _answer(api, wire, 400, body)
    if state in ("JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED"):
        for i in indexes:
            out.setdefault(i, LineResult("cancelled", error=f"the provider's batch job {state[10:].lower()} "
                                                            "before this request ran"))
    return out


def line_tasks(rec: BatchRecord, results: dict[int, LineResult] | None) -> dict[str, TaskRecord]:
    """The lines as task records, so that counts and output files read as a replayed batch's: queued
    while the provider runs them (`results` None), else each line's result."""
    out: dict[str, TaskRecord] = {}
    now = time.time()
    for ref in rec.lines:
        if ref.task_id is None:
            continue
        task = task_state.new_task(ref.task_id, rec.tenant, caller_protocol(rec.api),
                                   StoredRequest("POST", rec.endpoint, (), b""), rec.created_at)
        if results is not None:
            res = results.get(ref.index) or LineResult("failed", error="the provider returned no result for it")
            task = dataclasses.replace(task, status=res.kind, http_status=res.status, result=res.body,
                                       error=res.error, completed_at=now)
        out[ref.task_id] = task
    return out
