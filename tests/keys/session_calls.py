"""Store-key calls through a `Session` with plain ext_proc messages, shared by the key tests."""

from __future__ import annotations

from typing import Any

import orjson

from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import ROUTES, body_msg, chat_headers, headers_msg


async def call_session(gw: Gateway, headers: dict[str, str], body: bytes | None = None) -> tuple[Session, Any]:
    s = Session(gw, ROUTES)
    r = await s.handle(headers_msg(headers, eos=body is None))
    if body is not None and r.WhichOneof("response") != "immediate_response":
        r = await s.handle(body_msg(body))
    s.close()
    return s, r


def chat_call(key: str, model: str = "demo-gpt", protocol: str = "openai") -> tuple[dict[str, str], bytes]:
    if protocol == "anthropic":
        h = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": key,
             "anthropic-version": "2023-06-01"}
        return h, orjson.dumps({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
    return chat_headers(key), orjson.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})


def immediate_reply(r: Any) -> tuple[int, Any]:
    assert r.WhichOneof("response") == "immediate_response", r
    return r.immediate_response.status.code, orjson.loads(r.immediate_response.body)
