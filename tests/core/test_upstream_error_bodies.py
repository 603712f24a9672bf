"""A traceback from an upstream reaches the log (INFO, with the task id), never the caller."""

from __future__ import annotations

import logging

import orjson
import pytest

from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from tests.adapters.upstream_bodies import TRACEBACK
from tests.core.session_driver import KEY, body_msg, chat_headers, headers_msg, set_headers

ROUTES = build_routes()


def _no_trace(text: str) -> None:
    assert "Traceback" not in text and "/opt/venv" not in text and "secret_model_loader" not in text


@pytest.mark.parametrize("path,shape", [
    ("/v1/chat/completions", lambda d: d["error"]["message"]),
    ("/v1/messages", lambda d: d["error"]["message"]),
])
async def test_chat_5xx_traceback(gateway: Gateway, caplog: pytest.LogCaptureFixture, path: str, shape) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg({**chat_headers(), ":path": path}))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "max_tokens": 5,
                                              "messages": [{"role": "user", "content": "x"}]})))
    task = dict((h.header.key, h.header.raw_value.decode())
                for h in r.request_body.response.header_mutation.set_headers)["x-modelyard-task-id"]
    await s.handle(headers_msg({":status": "500", "content-type": "text/plain"}, response=True))
    with caplog.at_level(logging.INFO, logger="modelyard"):
        r = await s.handle(body_msg(TRACEBACK, response=True))
    message = shape(orjson.loads(r.response_body.response.body_mutation.body))
    assert message == f"upstream error (HTTP 500) (task {task})"
    _no_trace(message)
    logged = [rec for rec in caplog.records if task in rec.getMessage()]
    assert logged and all(rec.levelno == logging.INFO for rec in logged)
    assert "Traceback" in logged[0].getMessage()
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


async def test_vision_http_error_traceback(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v2/models/demo-colors/infer",
                                "authorization": f"Bearer {KEY}", "content-type": "application/json"}))
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}]}
    await s.handle(body_msg(orjson.dumps(body)))
    await s.handle(headers_msg({":status": "500", "content-type": "text/plain"}, response=True))
    with caplog.at_level(logging.INFO, logger="modelyard"):
        r = await s.handle(body_msg(TRACEBACK, response=True))
    out = orjson.loads(r.response_body.response.body_mutation.body)
    assert out["error"].startswith("upstream error (HTTP 500) (task ") and "Traceback" not in out["error"]
    assert any("Traceback" in rec.getMessage() and rec.levelno == logging.INFO for rec in caplog.records)


async def test_vision_grpc_message_sanitized(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v2/models/demo-colors/infer",
                                "authorization": f"Bearer {KEY}", "content-type": "application/json"}))
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}]}
    await s.handle(body_msg(orjson.dumps(body)))
    r = await s.handle(headers_msg({":status": "200", "content-type": "application/grpc", "grpc-status": "13",
                                    "grpc-message": TRACEBACK.decode().replace("\n", " | ")}, response=True))
    reply = r.response_headers.response
    assert reply.status == reply.CONTINUE_AND_REPLACE  # not a local reply: Envoy would stamp those
    assert set_headers(reply.header_mutation)[":status"] == "502"
    assert orjson.loads(reply.body_mutation.body)["error"] == "upstream gRPC status 13"
    assert "x-modelyard-upstream-host" not in set_headers(reply.header_mutation)
