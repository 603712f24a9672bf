"""A `protocol: responses` deployment (demo-gpt-responses) driven through the sans-I/O session: a
chat client's request is rendered for /v1/responses, an answer it cannot express is a 502 in its
own shape (whole or streamed), and a Responses client's call passes through untouched, metered."""

from __future__ import annotations

import orjson

from devstack.demo.responses_server import EXTRA_ITEMS, WEB_SEARCH, _stream_with_item_first, _with_item_first
from extproc.gateway import Gateway
from extproc.session import Session
from tests.adapters.fixtures import RESPONSES, STREAMS
from tests.core.session_driver import KEY, ROUTES, body_msg, chat_headers, headers_msg, set_headers

MODEL = "demo-gpt-responses"
ANSWER = orjson.dumps(RESPONSES["responses"]["text"])
HOSTED = _with_item_first(ANSWER, EXTRA_ITEMS[WEB_SEARCH])
HOSTED_STREAM = _stream_with_item_first(STREAMS["responses"]["text"], EXTRA_ITEMS[WEB_SEARCH])
SSE = {":status": "200", "content-type": "text/event-stream"}
JSON = {":status": "200", "content-type": "application/json"}


def _responses_headers() -> dict[str, str]:
    return {":method": "POST", ":path": "/v1/responses", "content-type": "application/json",
            "authorization": f"Bearer {KEY}"}


async def _sent(s: Session, headers: dict[str, str], body: dict) -> tuple[dict[str, str], bytes]:
    await s.handle(headers_msg(headers))
    r = await s.handle(body_msg(orjson.dumps(body)))
    common = r.request_body.response
    return set_headers(common.header_mutation), common.body_mutation.body


async def test_a_chat_request_goes_to_the_responses_endpoint(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    hs, body = await _sent(s, chat_headers(), {"model": MODEL, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    assert hs[":path"] == "/v1/responses" and hs["x-modelyard-cluster"] == "demo-responses"
    sent = orjson.loads(body)
    assert sent["instructions"] == "be brief" and sent["store"] is False
    assert sent["input"] == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    await s.handle(headers_msg(JSON, response=True))
    r = await s.handle(body_msg(ANSWER, response=True))
    out = orjson.loads(r.response_body.response.body_mutation.body)
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == "Hello there"
    assert out["model"] == MODEL
    s.close()


async def test_a_hosted_tool_answer_is_a_502_in_the_callers_shape(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await _sent(s, chat_headers(), {"model": MODEL, "messages": [{"role": "user", "content": "search"}]})
    await s.handle(headers_msg(JSON, response=True))
    r = await s.handle(body_msg(HOSTED, response=True))
    resp = r.response_body.response
    assert set_headers(resp.header_mutation)[":status"] == "502"
    err = orjson.loads(resp.body_mutation.body)["error"]
    assert "web_search_call" in err["message"] and "POST /v1/responses" in err["message"]
    s.close()


async def test_a_hosted_tool_stream_ends_in_an_error_event(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    headers = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json", "x-api-key": KEY}
    await _sent(s, headers, {"model": MODEL, "max_tokens": 50, "stream": True,
                             "messages": [{"role": "user", "content": "search"}]})
    await s.handle(headers_msg(SSE, response=True))
    r = await s.handle(body_msg(HOSTED_STREAM, response=True))
    out = r.response_body.response.body_mutation.body
    assert b"event: error" in out and b"web_search_call" in out and b"message_stop" not in out
    s.close()


async def test_a_responses_client_passes_through_and_is_metered(gateway: Gateway) -> None:
    for stream, answer, ctype in ((False, HOSTED, JSON), (True, HOSTED_STREAM, SSE)):
        s = Session(gateway, ROUTES)
        hs, body = await _sent(s, _responses_headers(), {"model": MODEL, "input": "search", "stream": stream})
        assert hs[":path"] == "/v1/responses" and body == b""  # the client's own bytes (same model name)
        await s.handle(headers_msg(ctype, response=True))
        r = await s.handle(body_msg(answer, response=True))
        # The caller's own protocol carries the hosted tool's item: its bytes go back as sent.
        assert not r.response_body.response.HasField("body_mutation"), stream
        assert ":status" not in set_headers(r.response_body.response.header_mutation)
        flow = s.flow
        assert flow is not None and flow.usage is not None  # type: ignore[attr-defined]
        assert (flow.usage.input_tokens, flow.usage.output_tokens) == (11, 2)  # type: ignore[attr-defined]
        s.close()


async def test_an_untranslatable_stream_is_no_upstream_failure(gateway: Gateway) -> None:
    """Routing feedback: the upstream answered well; the caller's protocol is what falls short."""
    s = Session(gateway, ROUTES)
    await _sent(s, chat_headers(), {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "x"}]})
    await s.handle(headers_msg(SSE, response=True))
    r = await s.handle(body_msg(HOSTED_STREAM, response=True))
    assert b"web_search_call" in r.response_body.response.body_mutation.body
    assert s.flow is not None and s.flow.upstream_failed is False  # type: ignore[attr-defined]
    s.close()


async def test_hosted_tools_pass_through_to_a_responses_deployment_only(gateway: Gateway) -> None:
    body = {"input": "search the web", "tools": [{"type": "web_search"}], "reasoning": {"effort": "low"}}
    s = Session(gateway, ROUTES)
    hs, sent = await _sent(s, _responses_headers(), {"model": MODEL, **body})
    assert hs[":path"] == "/v1/responses" and sent == b""  # the client's own bytes, tools and all
    s.close()
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(_responses_headers()))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", **body})))
    assert r.immediate_response.status.code == 400
    err = orjson.loads(r.immediate_response.body)["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("reasoning options, web_search tools: only a deployment speaking this API")
    assert "demo-openai, which speaks openai" in err["message"]
    s.close()
