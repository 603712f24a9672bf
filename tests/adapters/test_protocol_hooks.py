"""The per-protocol request rules behind `ChatProtocol`: the query's rules and the same-protocol body."""

from __future__ import annotations

import orjson
import pytest

from adapters.internal import ChatRequest, Message, TextPart
from adapters.registry import PROTOCOLS
from contracts.errors import ClientError

HI = (Message("user", (TextPart("hi"),)),)


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_check_query_only_gemini_streams_need_alt_sse(name: str) -> None:
    proto = PROTOCOLS[name]
    proto.check_query({}, stream_hint=False)
    proto.check_query({"alt": "sse"}, stream_hint=True)
    if name == "gemini":
        with pytest.raises(ClientError, match=r"alt=sse"):
            proto.check_query({"alt": "json"}, stream_hint=True)
    else:
        proto.check_query({}, stream_hint=True)


@pytest.mark.parametrize("name,stream,include_usage,injected", [
    pytest.param("openai", True, False, True, id="openai-stream-without-usage"),
    pytest.param("openai", True, True, False, id="openai-stream-with-usage"),
    pytest.param("openai", False, False, False, id="openai-unary"),
    pytest.param("anthropic", True, False, False, id="anthropic-stream"),
    pytest.param("responses", True, False, False, id="responses-stream"),
    pytest.param("azure-openai", True, False, True, id="azure-openai-stream-without-usage"),
])
def test_passthrough_body_swaps_the_model(name: str, stream: bool, include_usage: bool, injected: bool) -> None:
    body = orjson.dumps({"model": "client-model", "messages": [], "vendor_field": {"kept": True}})
    req = ChatRequest("client-model", HI, stream=stream, include_usage=include_usage)
    out, flag = PROTOCOLS[name].passthrough_body(body, req, upstream_model="up-model")
    data = orjson.loads(out)
    assert data["model"] == "up-model" and data["vendor_field"] == {"kept": True} and flag is injected
    assert ("stream_options" in data) is injected
    if injected:
        assert data["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("name", ["openai", "anthropic", "responses", "gemini"])
def test_passthrough_body_keeps_the_very_bytes_when_nothing_changes(name: str) -> None:
    body = b'{"model": "same",  "messages": []}'  # odd spacing: a re-render would show
    req = ChatRequest("same", HI, stream=False)
    out, flag = PROTOCOLS[name].passthrough_body(body, req, upstream_model="same")
    assert out is body and not flag


@pytest.mark.parametrize("name", ["gemini", "bedrock", "vertex"])
def test_model_in_path_passthrough_never_touches_the_body(name: str) -> None:
    body = b'{"contents": []}'  # the model is in the path
    out, flag = PROTOCOLS[name].passthrough_body(body, ChatRequest("a", HI, stream=True), upstream_model="b")
    assert out is body and not flag
