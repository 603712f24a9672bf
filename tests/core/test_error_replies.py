"""One error renderer per caller protocol, one signature, one table; gRPC callers get a gRPC status."""

from __future__ import annotations

import orjson
import pytest

from adapters.registry import PROTOCOLS
from contracts.errors import ClientError
from extproc.errors import ERROR_RENDERERS, error_response, render_error_body


@pytest.mark.parametrize("protocol", sorted(ERROR_RENDERERS))
def test_every_protocol_renders_with_the_same_signature(protocol: str) -> None:
    body = ERROR_RENDERERS[protocol](429, "slow down", "rate_limit_error")
    assert b"slow down" in body


def test_the_table_covers_every_caller_protocol() -> None:
    assert set(ERROR_RENDERERS) == {*PROTOCOLS, "kserve", "kserve-grpc", "mcp"}


def test_kserve_and_unknown_protocols() -> None:
    assert orjson.loads(render_error_body("kserve", 400, "bad", "invalid_request_error")) == {"error": "bad"}
    # An unknown caller protocol answers as OpenAI does.
    assert orjson.loads(render_error_body("nope", 400, "bad", "invalid_request_error"))["error"]["message"] == "bad"


def test_http_caller_gets_status_and_json() -> None:
    r = error_response("anthropic", ClientError("broken", status=400), [("x-modelyard-task-id", "t")])
    ir = r.immediate_response
    assert ir.status.code == 400 and not ir.HasField("grpc_status")
    assert orjson.loads(ir.body)["error"]["message"] == "broken"
    assert {h.header.key for h in ir.headers.set_headers} >= {"content-type", "x-modelyard-task-id"}


def test_grpc_caller_gets_a_grpc_status_and_the_message() -> None:
    r = error_response("kserve-grpc", ClientError("slow down", status=429))
    ir = r.immediate_response
    assert ir.grpc_status.status == 8  # RESOURCE_EXHAUSTED for a 429
    assert ir.body == b"slow down" and ir.status.code == 200
    assert "content-type" not in {h.header.key for h in ir.headers.set_headers}
