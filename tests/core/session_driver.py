"""Drive one request through a `Session` with plain ext_proc messages, as the fuzz tests do."""

from __future__ import annotations

import asyncio
import logging

import pytest

from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from tests.core.test_session import body_msg, headers_msg

ROUTES = build_routes()


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
