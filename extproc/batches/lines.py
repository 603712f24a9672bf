"""A batch's input, pure: OpenAI's JSONL input file and Anthropic's `requests` array, each line
either a request to run (its path and body) or refused with a reason (it goes to the error file).

OpenAI refuses a whole file with one bad line; here a malformed line is reported in the error file
and the others run (docs/batches.md). Anthropic's array is refused whole (400), as Anthropic does.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from contracts.errors import ClientError
from extproc.batches.ids import line_task_id

# The batch endpoints the gateway runs, and the caller protocol each line is replayed in.
OPENAI_ENDPOINTS = {"/v1/chat/completions": "openai", "/v1/embeddings": "openai", "/v1/responses": "responses"}
ANTHROPIC_PATH = "/v1/messages"
_CUSTOM_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # Anthropic's rule for custom_id
_MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class LineRef:
    """One request of a batch as its record keeps it: which task runs it, or why none does."""

    index: int  # the input file's line number (1-based), or the position in Anthropic's array (0-based)
    custom_id: str | None
    task_id: str | None  # None: refused before running
    error_code: str | None = None
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class LineRequest:
    ref: LineRef
    body: bytes  # the request body to replay (empty for a refused line)


def _refused(index: int, custom_id: str | None, code: str, message: str) -> LineRequest:
    return LineRequest(LineRef(index, custom_id, None, code, message), b"")


def _openai_line(raw: bytes, index: int, batch_id: str, endpoint: str, seen: set[str]) -> LineRequest:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _refused(index, None, "invalid_json_line", f"line {index} is not valid JSON")
    if not isinstance(doc, dict):
        return _refused(index, None, "invalid_request", f"line {index} is not a JSON object")
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid or len(cid) > _MAX_CUSTOM_ID:
        return _refused(index, None, "missing_required_parameter",
                        f"line {index}: custom_id must be a non-empty string")
    if cid in seen:
        return _refused(index, cid, "duplicate_custom_id", f"line {index}: custom_id {cid!r} is used twice")
    seen.add(cid)
    if doc.get("method", "POST") != "POST":
        return _refused(index, cid, "invalid_method", f"line {index}: method must be POST")
    if doc.get("url") != endpoint:
        return _refused(index, cid, "invalid_url", f"line {index}: url must be the batch's endpoint {endpoint}")
    body = doc.get("body")
    if not isinstance(body, dict):
        return _refused(index, cid, "invalid_request", f"line {index}: body must be a JSON object")
    if body.get("stream"):
        return _refused(index, cid, "invalid_request", f"line {index}: a batch request cannot stream")
    return LineRequest(LineRef(index, cid, line_task_id(batch_id, index)), orjson.dumps(body))


def parse_openai_input(data: bytes, batch_id: str, endpoint: str, max_lines: int) -> list[LineRequest]:
    """Each non-blank line of an OpenAI batch input file; ClientError when the file is no batch at all."""
    if endpoint not in OPENAI_ENDPOINTS:
        raise ClientError(f"endpoint must be one of {', '.join(OPENAI_ENDPOINTS)}, not {endpoint!r}")
    out: list[LineRequest] = []
    seen: set[str] = set()
    for n, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(out) >= max_lines:
            raise ClientError(f"the input file has more than {max_lines} requests")
        out.append(_openai_line(raw, n, batch_id, endpoint, seen))
    if not out:
        raise ClientError("the input file has no requests")
    return out


def parse_anthropic_requests(doc: Any, batch_id: str, max_lines: int) -> list[LineRequest]:
    """`{"requests": [{"custom_id", "params"}, ...]}`; anything malformed refuses the whole batch."""
    reqs = doc.get("requests") if isinstance(doc, dict) else None
    if not isinstance(reqs, list) or not reqs:
        raise ClientError("requests: a non-empty array of {custom_id, params} is required")
    if len(reqs) > max_lines:
        raise ClientError(f"requests: at most {max_lines} requests in one batch")
    out: list[LineRequest] = []
    seen: set[str] = set()
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            raise ClientError(f"requests.{i}: must be an object")
        cid = r.get("custom_id")
        if not isinstance(cid, str) or not _CUSTOM_ID.match(cid):
            raise ClientError(f"requests.{i}.custom_id: 1-64 letters, digits, '_' or '-'")
        if cid in seen:
            raise ClientError(f"requests.{i}.custom_id: {cid!r} is used twice")
        seen.add(cid)
        params = r.get("params")
        if not isinstance(params, dict):
            raise ClientError(f"requests.{i}.params: must be an object")
        if params.get("stream"):
            raise ClientError(f"requests.{i}.params.stream: a batch request cannot stream")
        out.append(LineRequest(LineRef(i, cid, line_task_id(batch_id, i)), orjson.dumps(params)))
    return out
