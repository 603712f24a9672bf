"""Only documented x-modelyard-* headers reach a caller, whichever path answers."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from extproc import messages as msg
from extproc.gateway import Gateway
from extproc.public_headers import PUBLIC_RESPONSE_HEADERS, is_internal, scrub
from extproc.service import build_routes
from extproc.session import Session
from tests.core.session_driver import KEY, body_msg, chat_headers, headers_msg

ROUTES = build_routes()
UPSTREAM = {":status": "200", "content-type": "application/json", "x-modelyard-upstream-host": "10.0.0.7:8000",
            "x-modelyard-upstream-attempts": "1", "x-modelyard-tenant": "other", "x-modelyard-debug": "1"}


def _mutation(r: msg.ProcessingResponse) -> msg.pb.HeaderMutation:
    kind = r.WhichOneof("response")
    if kind == "immediate_response":
        return r.immediate_response.headers
    if kind == "response_trailers":
        return r.response_trailers.header_mutation
    return getattr(r, kind).response.header_mutation


def _assert_public(r: msg.ProcessingResponse, seen: dict[str, str] | None = None) -> None:
    m = _mutation(r)
    assert not [h.header.key for h in m.set_headers if is_internal(h.header.key)]
    for name in seen or {}:
        if is_internal(name):
            assert name in m.remove_headers, (name, list(m.remove_headers))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.sampled_from(sorted(PUBLIC_RESPONSE_HEADERS)),
                          st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map("x-modelyard-".__add__),
                          st.sampled_from(["content-type", "x-ratelimit-limit-requests", "X-Modelyard-Tenant"])),
                max_size=8))
def test_scrub_keeps_exactly_the_allow_list(names: list[str]) -> None:
    pairs = [(n, "v") for n in names]
    for r in (msg.immediate(200, b"{}", pairs), msg.response_headers(pairs), msg.response_body(pairs)):
        kept = [h.header.key for h in _mutation(scrub(r, names)).set_headers]
        assert kept == [n for n in names if not is_internal(n)]


async def test_vision_reply_drops_the_upstream_host_and_attempts(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg({":method": "POST", ":path": "/v2/models/demo-colors/infer",
                                "authorization": f"Bearer {KEY}", "content-type": "application/json"}))
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 32, 32], "data": [0.0] * 3072}]}
    r = await s.handle(body_msg(orjson.dumps(body)))
    assert r.WhichOneof("response") == "request_body"
    up = {**UPSTREAM, "content-type": "application/grpc"}
    r = await s.handle(headers_msg(up, response=True))
    _assert_public(r, up)
    r = await s.handle(pb_trailers({"grpc-status": "0", "x-modelyard-upstream-host": "h"}))
    _assert_public(r, {"x-modelyard-upstream-host": "h"})


def pb_trailers(pairs: dict[str, str]) -> msg.ProcessingRequest:
    from envoy.config.core.v3 import base_pb2

    hm = base_pb2.HeaderMap(headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()])
    return msg.ProcessingRequest(response_trailers=msg.pb.HttpTrailers(trailers=hm))


async def test_chat_and_errors_and_local_answers(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})))
    _assert_public(await s.handle(headers_msg({**UPSTREAM, ":status": "500"}, response=True)), UPSTREAM)
    for h in ({":method": "GET", ":path": "/v1/models", "authorization": f"Bearer {KEY}"},
              {":method": "GET", ":path": "/v1/models"},
              {":method": "GET", ":path": "/nope", "authorization": f"Bearer {KEY}"}):
        r = await Session(gateway, ROUTES).handle(headers_msg(h, eos=True))
        assert r.WhichOneof("response") == "immediate_response"
        _assert_public(r)
