"""Drive a `Session` with plain ext_proc messages: the message builders the session tests share,
and one request run to a refusal or a forward, as the fuzz tests do."""

from __future__ import annotations

import asyncio
import logging

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from tests.stack_config import ROOT

__all__ = ["ROOT", "ROUTES", "KEY", "assert_refused_or_forwarded", "body_msg", "chat_headers", "headers_msg",
           "set_headers"]

ROUTES = build_routes()
KEY = "sk-modelyard-demo"


def headers_msg(pairs: dict[str, str], eos: bool = False, response: bool = False) -> pb.ProcessingRequest:
    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])
    h = pb.HttpHeaders(headers=hm, end_of_stream=eos)
    return pb.ProcessingRequest(response_headers=h) if response else pb.ProcessingRequest(request_headers=h)


def body_msg(body: bytes, response: bool = False, eos: bool = True) -> pb.ProcessingRequest:
    b = pb.HttpBody(body=body, end_of_stream=eos)
    return pb.ProcessingRequest(response_body=b) if response else pb.ProcessingRequest(request_body=b)


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


def chat_headers(key: str | None = KEY) -> dict[str, str]:
    h = {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json"}
    if key:
        h["authorization"] = f"Bearer {key}"
    return h


def assert_refused_or_forwarded(gateway: Gateway, caplog: pytest.LogCaptureFixture, headers: dict[str, str],
                                body: bytes, timeout: float | None = None) -> None:
    """The request either gets a 4xx in its caller's shape or goes upstream; nothing is logged
    as an error (an unexpected exception would be, and would answer 502)."""
    async def run():
        s = Session(gateway, ROUTES)
        await s.handle(headers_msg(headers))
        r = await asyncio.wait_for(s.handle(body_msg(body)), timeout)
        s.close()
        return r

    with caplog.at_level(logging.ERROR, logger="modelyard"):
        r = asyncio.run(run())
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    kind = r.WhichOneof("response")
    if kind == "immediate_response":
        assert 400 <= r.immediate_response.status.code < 500, r.immediate_response.body[:300]
    else:
        assert kind == "request_body"
