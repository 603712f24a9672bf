"""JSON-RPC 2.0 as MCP's streamable HTTP carries it: one message per POST (the 2025-06-18
revision dropped batches), errors in the spec's shape with the HTTP status that goes with them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from adapters.json_types import JSONObject

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Implementation-defined server errors (-32000..-32099): the gateway's own refusals and upstream failures.
GATEWAY_ERROR = -32000
SESSION_ERROR = -32001
RequestId = str | int


@dataclass(frozen=True, slots=True)
class Message:
    """One client message: a request (id set), a notification (no id) or a response to a server request."""

    method: str
    id: RequestId | None
    params: JSONObject
    is_response: bool = False

    @property
    def is_request(self) -> bool:
        return self.id is not None and not self.is_response


class RpcError(Exception):
    """A JSON-RPC error for the request `id`, answered with HTTP `status`."""

    def __init__(self, code: int, message: str, *, status: int = 200, id: RequestId | None = None,
                 data: JSONObject | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.status, self.id, self.data = code, message, status, id, data


def parse_message(body: bytes) -> Message:
    """The client's message, or an `RpcError` (HTTP 400) that says what is wrong with it."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise RpcError(PARSE_ERROR, f"Parse error: the body is not JSON ({e.msg})", status=400) from None
    if isinstance(doc, list):
        raise RpcError(INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not supported (MCP 2025-06-18)",
                       status=400)
    if not isinstance(doc, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: expected a JSON-RPC object", status=400)
    rid = doc.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, str | int)):
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer", status=400)
    if doc.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"', status=400, id=rid)
    if "method" not in doc:
        if rid is not None and ("result" in doc or "error" in doc):
            return Message("", rid, {}, is_response=True)
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "method" is missing', status=400, id=rid)
    method = doc["method"]
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string', status=400, id=rid)
    params = doc.get("params", {})
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, 'Invalid params: "params" must be an object', status=400, id=rid)
    return Message(method, rid, params)


def result_body(rid: RequestId | None, result: Any) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": rid, "result": result})


def error_body(e: RpcError) -> bytes:
    err: dict[str, Any] = {"code": e.code, "message": e.message}
    if e.data is not None:
        err["data"] = e.data
    return orjson.dumps({"jsonrpc": "2.0", "id": e.id, "error": err})


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    """Any gateway error before a message was read (401, 413, 503, ...): id null, as JSON-RPC says
    for an error whose request id is unknown."""
    code = INVALID_REQUEST if status == 400 else SESSION_ERROR if status == 404 else GATEWAY_ERROR
    data: JSONObject = {"status": status}
    if type:
        data["type"] = type
    return error_body(RpcError(code, message, status=status, data=data))


def sse_event(payload: bytes, event_id: str | None = None) -> bytes:
    """One server-sent event carrying one JSON-RPC message (JSON has no raw newlines); with an id,
    the one a client sends back as `Last-Event-ID` to resume after it."""
    head = b"id: " + event_id.encode() + b"\n" if event_id else b""
    return head + b"event: message\ndata: " + payload + b"\n\n"
