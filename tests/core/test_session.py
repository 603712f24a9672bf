"""The sans-I/O session driven with plain ext_proc messages: no Envoy, no sockets."""

from __future__ import annotations

import orjson
import pytest

from extproc import messages as msg
from extproc.gateway import Gateway
from extproc.session import Session
from tests.core.session_driver import KEY, ROUTES, body_msg, chat_headers, headers_msg, set_headers


async def test_chat_round_trip(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    r = await s.handle(headers_msg(chat_headers()))
    assert r.WhichOneof("response") == "request_headers"
    assert "x-modelyard-cluster" in r.request_headers.response.header_mutation.remove_headers

    body = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})
    r = await s.handle(body_msg(body))
    common = r.request_body.response
    hs = set_headers(common.header_mutation)
    assert hs["x-modelyard-cluster"] == "demo-openai"
    assert hs[":path"] == "/v1/chat/completions"
    assert hs["x-envoy-upstream-rq-timeout-ms"] == "60000"  # the deployment's timeout_ms, for Envoy's router
    assert common.clear_route_cache
    assert "authorization" in common.header_mutation.remove_headers or "authorization" in hs

    r = await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    hs = set_headers(r.response_headers.response.header_mutation)
    assert len(hs["x-modelyard-task-id"]) == 32
    assert hs["x-modelyard-cluster"] == "demo-openai"

    upstream = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    r = await s.handle(body_msg(upstream, response=True))
    assert r.WhichOneof("response") == "response_body"
    s.close()


@pytest.mark.parametrize("key,status", [(None, 401), ("sk-nope", 401)])
async def test_auth_errors_are_immediate(gateway: Gateway, key: str | None, status: int) -> None:
    r = await Session(gateway, ROUTES).handle(headers_msg(chat_headers(key)))
    assert r.immediate_response.status.code == status
    err = orjson.loads(r.immediate_response.body)["error"]
    assert err["type"] and err["message"]


async def test_unknown_model_and_bad_json(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    r = await s.handle(body_msg(b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}'))
    assert r.immediate_response.status.code == 404
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    r = await s.handle(body_msg(b"{oops"))
    assert r.immediate_response.status.code == 400


async def test_models_list_without_upstream(gateway: Gateway) -> None:
    r = await Session(gateway, ROUTES).handle(headers_msg({":method": "GET", ":path": "/v1/models",
                                                   "authorization": f"Bearer {KEY}"}, eos=True))
    data = orjson.loads(r.immediate_response.body)
    assert r.immediate_response.status.code == 200
    assert data["object"] == "list" and {m["id"] for m in data["data"]} >= {"demo-gpt", "demo-colors"}


@pytest.mark.parametrize("path", ["/v1/models", "/v1/models/demo-gemini", "/v1/models/no-such-model"])
async def test_the_shared_model_paths_answer_a_gemini_key_in_geminis_shape(gateway: Gateway, path: str) -> None:
    # google-genai asks on /v1/ with its own header: the list, a model and an unknown one in its shape
    r = await Session(gateway, ROUTES).handle(headers_msg({":method": "GET", ":path": path,
                                                           "x-goog-api-key": KEY}, eos=True))
    data = orjson.loads(r.immediate_response.body)
    if path.endswith("no-such-model"):
        assert r.immediate_response.status.code == 404 and data["error"]["status"] == "NOT_FOUND"
    elif path == "/v1/models":
        assert "models/demo-gemini" in {m["name"] for m in data["models"]}
    else:
        assert data["name"] == "models/demo-gemini" and "generateContent" in data["supportedGenerationMethods"]
    r = await Session(gateway, ROUTES).handle(headers_msg({":method": "GET", ":path": path,
                                                           "authorization": f"Bearer {KEY}"}, eos=True))
    assert "models" not in orjson.loads(r.immediate_response.body)  # a bearer key: OpenAI's shape, as before


async def test_an_anthropic_caller_on_the_shared_model_paths_gets_anthropics_errors(gateway: Gateway) -> None:
    for key, status, kind in ((KEY, 404, "not_found_error"), ("sk-not-a-key", 401, "authentication_error")):
        r = await Session(gateway, ROUTES).handle(headers_msg({":method": "GET", ":path": "/v1/models/no-such-model",
                                                               "x-api-key": key, "anthropic-version": "2023-06-01"},
                                                              eos=True))
        data = orjson.loads(r.immediate_response.body)
        assert r.immediate_response.status.code == status
        assert data["type"] == "error" and data["error"]["type"] == kind


async def test_gemini_count_tokens_counts_a_whole_generate_content_request(gateway: Gateway) -> None:
    async def count(body: dict) -> int:
        s = Session(gateway, ROUTES)
        await s.handle(headers_msg({":method": "POST", ":path": "/v1beta/models/demo-gemini:countTokens",
                                    "x-goog-api-key": KEY, "content-type": "application/json"}))
        r = await s.handle(body_msg(orjson.dumps(body)))
        assert r.immediate_response.status.code == 200
        return int(orjson.loads(r.immediate_response.body)["totalTokens"])

    contents = [{"role": "user", "parts": [{"text": "how many tokens is this"}]}]
    plain = await count({"contents": contents})
    whole = await count({"generateContentRequest": {"model": "models/demo-gemini", "contents": contents,
                                                    "systemInstruction": {"parts": [{"text": "answer in verse " * 20}]}}})
    assert 0 < plain < whole  # the system instruction counts too


async def test_responses_input_tokens_counts_with_or_without_a_model(gateway: Gateway) -> None:
    async def count(body: dict) -> tuple[int, dict]:
        s = Session(gateway, ROUTES)
        await s.handle(headers_msg({":method": "POST", ":path": "/v1/responses/input_tokens",
                                    "authorization": f"Bearer {KEY}", "content-type": "application/json"}))
        r = await s.handle(body_msg(orjson.dumps(body)))
        return r.immediate_response.status.code, orjson.loads(r.immediate_response.body)

    short = await count({"model": "demo-gpt", "input": "how many tokens is this"})
    assert short[0] == 200 and short[1]["object"] == "response.input_tokens" and short[1]["input_tokens"] > 0
    unnamed = await count({"input": "how many tokens is this"})  # the model is optional: the estimate is every model's
    assert unnamed == short
    long = await count({"model": "demo-gpt", "input": "how many tokens is this", "instructions": "answer in verse " * 20})
    assert long[1]["input_tokens"] > short[1]["input_tokens"]  # the instructions count too
    status, err = await count({"model": "no-such-model", "input": "x"})
    assert status == 404 and err["error"]["code"] == "model_not_found"
    status, err = await count({"input": "x", "previous_response_id": "resp_1"})  # refused as a call would be
    assert status == 400 and "does not store responses" in err["error"]["message"]
    status, err = await count({"model": 5, "input": "x"})
    assert status == 400 and err["error"]["type"] == "invalid_request_error"


async def test_a_moderation_without_a_model_needs_the_caller_to_have_exactly_one(gateway: Gateway) -> None:
    async def moderate(key: str) -> msg.ProcessingResponse:
        s = Session(gateway, ROUTES)
        await s.handle(headers_msg({":method": "POST", ":path": "/v1/moderations", "authorization": f"Bearer {key}",
                                    "content-type": "application/json"}))
        return await s.handle(body_msg(b'{"input": "hello"}'))

    sent = await moderate(KEY)  # tenant demo: demo-moderation alone stands in, named in the upstream's body
    assert orjson.loads(sent.request_body.response.body_mutation.body) == {"input": "hello", "model": "demo-moderation"}
    refused = await moderate("sk-modelyard-demo-l3")  # tenant demo-l3 has none
    err = orjson.loads(refused.immediate_response.body)["error"]
    assert refused.immediate_response.status.code == 400 and "no moderation model" in err["message"]


async def test_several_choices_are_refused_where_guardrails_check_answers(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    r = await s.handle(body_msg(orjson.dumps({"model": "demo-guarded", "n": 2,  # demo-safety moderates answers
                                              "messages": [{"role": "user", "content": "hello"}]})))
    assert r.immediate_response.status.code == 400
    assert "several answers to one call" in orjson.loads(r.immediate_response.body)["error"]["message"]


async def test_upstream_5xx_becomes_502_in_client_shape(gateway: Gateway) -> None:
    s = Session(gateway, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})))
    r = await s.handle(headers_msg({":status": "500", "content-type": "text/plain"}, response=True))
    assert set_headers(r.response_headers.response.header_mutation)[":status"] == "502"
    r = await s.handle(body_msg(b"upstream exploded", response=True))
    out = orjson.loads(r.response_body.response.body_mutation.body)
    assert "upstream" in out["error"]["message"]


async def test_an_in_memory_token_reservation_is_reconciled_in_place() -> None:
    """An L3 tenant's token estimate is corrected when the call is metered, with no task per request."""
    import yaml

    from contracts.config import parse_config
    from ratelimit import Limiter
    from tests.stack_config import ROOT, without_watermarks

    config = parse_config(without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text())))
    limiter = Limiter(config.ratelimit)
    gw = Gateway.build(config, limiter=limiter)
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers("sk-modelyard-demo-l3")))
    await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})))
    choice = s.flow.call.choice  # type: ignore[union-attr]
    assert choice is not None and choice.reservation is not None and not choice.reservation.settled
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    await s.handle(body_msg(orjson.dumps({
        "id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "yo"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}), response=True))
    assert choice.reservation.settled and not gw.accountant._background
    s.close()
    await gw.close()
