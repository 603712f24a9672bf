"""Error bodies, client API keys, route detection and the SSE framer."""

from __future__ import annotations

import anthropic as anthropic_sdk
import orjson
import pytest

from adapters import anthropic, gemini, openai
from adapters.registry import PROTOCOLS, ClientRoute, detect_client_protocol, translate_stream
from adapters.sse import SSEEvent, SSEFramer, encode_event
from contracts.errors import ClientError, UpstreamError
from tests.adapters.fixtures import CANONICAL

NAMES = ["openai", "anthropic", "gemini"]


def test_render_error_shapes() -> None:
    assert orjson.loads(openai.render_error(401, "bad key")) == {"error": {
        "message": "bad key", "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
    assert orjson.loads(openai.render_error(500, "x"))["error"]["type"] == "server_error"
    assert orjson.loads(anthropic.render_error(429, "slow")) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}
    assert orjson.loads(anthropic.render_error(400, "m", "invalid_request_error"))["error"]["type"] == \
        "invalid_request_error"
    assert orjson.loads(gemini.render_error(429, "slow")) == {
        "error": {"code": 429, "message": "slow", "status": "RESOURCE_EXHAUSTED"}}
    assert orjson.loads(gemini.render_error(418, "tea"))["error"]["status"] == "INVALID_ARGUMENT"


def test_anthropic_sdk_maps_our_error_body_to_its_exception() -> None:
    import httpx

    req = httpx.Request("POST", "http://x/v1/messages")
    resp = httpx.Response(429, request=req, content=anthropic.render_error(429, "slow down"))
    client = anthropic_sdk.Anthropic(api_key="k", base_url="http://x")
    err = client._make_status_error_from_response(resp)
    assert isinstance(err, anthropic_sdk.RateLimitError) and "slow down" in str(err)


@pytest.mark.parametrize("proto", NAMES)
def test_parse_error_round_trips_and_survives_garbage(proto: str) -> None:
    mod = PROTOCOLS[proto]
    assert mod.parse_error(400, mod.render_error(400, "broken thing")) == "broken thing"
    for other in NAMES:
        assert mod.parse_error(500, PROTOCOLS[other].render_error(500, "boom")) == "boom"
    # Text that is not a provider error object is never forwarded (it may be a traceback).
    assert mod.parse_error(502, b"<html>Bad Gateway</html>") == "upstream returned HTTP 502"
    assert mod.parse_error(503, b"") == "upstream returned HTTP 503"
    assert mod.parse_error(503, b'{"error":{"message":5}}') == "upstream returned HTTP 503"
    assert mod.parse_error(400, b'[{"error":{"message":"arr"}}]') == "arr"
    assert mod.parse_error(400, b'{"error":"plain"}') == "plain"


def test_client_api_keys() -> None:
    assert openai.client_api_key({"authorization": "Bearer sk-1"}, {}) == "sk-1"
    assert openai.client_api_key({"Authorization": "bearer sk-2"}, {}) == "sk-2"
    assert openai.client_api_key({"x-api-key": "sk"}, {}) is None
    assert anthropic.client_api_key({"x-api-key": "ak"}, {}) == "ak"
    assert anthropic.client_api_key({"authorization": "Bearer ak2"}, {}) == "ak2"
    assert anthropic.client_api_key({}, {}) is None
    assert gemini.client_api_key({"x-goog-api-key": "gk"}, {}) == "gk"
    assert gemini.client_api_key({}, {"key": "qk"}) == "qk"
    assert gemini.client_api_key({"authorization": "Basic x"}, {}) is None
    assert "authorization" in openai.CLIENT_AUTH_HEADERS
    assert {"x-api-key", "authorization"} <= set(anthropic.CLIENT_AUTH_HEADERS)
    assert "x-goog-api-key" in gemini.CLIENT_AUTH_HEADERS


@pytest.mark.parametrize(("method", "path", "route"), [
    ("POST", "/v1/chat/completions", ClientRoute("openai")),
    ("POST", "/v1/chat/completions?x=1", ClientRoute("openai")),
    ("POST", "/v1/messages", ClientRoute("anthropic")),
    ("POST", "/v1/messages?beta=true", ClientRoute("anthropic")),
    ("POST", "/v1beta/models/gemini-2.0-flash:generateContent", ClientRoute("gemini", "gemini-2.0-flash", False)),
    ("POST", "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&key=k",
     ClientRoute("gemini", "gemini-2.0-flash", True)),
    ("POST", "/v1beta/models/a%2Fb:generateContent", ClientRoute("gemini", "a/b", False)),
    ("GET", "/v1/chat/completions", None),
    ("POST", "/v1/completions", ClientRoute("completions")),
    ("POST", "/v1beta/models/x:countTokens", None),
    ("POST", "/v1beta/models/:generateContent", None),
    ("POST", "/", None),
], ids=[
    "openai", "openai-query", "anthropic", "anthropic-beta", "gemini", "gemini-stream", "gemini-escaped-model",
    "GET-chat", "legacy-completions", "countTokens", "empty-model", "root"
])
def test_detect_client_protocol(method: str, path: str, route: ClientRoute | None) -> None:
    assert detect_client_protocol(method, path) == route


def test_translate_stream_rejects_unknown_protocols() -> None:
    with pytest.raises(ValueError):
        translate_stream("openai", "kserve", CANONICAL)


def test_sse_framer_rules() -> None:
    f = SSEFramer()
    evs = f.feed(b": keep-alive\nevent: a\ndata: 1\ndata:2\nid: 7\nretry: 5\n\ndata: x")
    assert evs == [SSEEvent("a", b"1\n2")]
    assert f.feed(b"y\r") == []
    assert f.feed(b"\n\r\n") == [SSEEvent(None, b"xy")]
    assert f.feed(b"\n\n\n") == []
    assert f.feed(b"data: tail") == [] and f.close() == [SSEEvent(None, b"tail")]
    assert encode_event(b"{}", "ping") == b"event: ping\ndata: {}\n\n"
    assert encode_event(b"{}") == b"data: {}\n\n"


def test_error_defaults() -> None:
    e = ClientError("slow", status=429)
    assert (e.status, e.type, str(e)) == (429, "rate_limit_error", "slow")
    assert UpstreamError("x").type == "api_error" and ClientError("x", status=418).type == "invalid_request_error"
