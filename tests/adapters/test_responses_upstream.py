"""The Responses API as an upstream protocol: what a chat client's request becomes, and how a
Responses answer (whole or streamed) reaches chat clients; output a chat protocol cannot express
(a hosted tool's call, a custom tool call) is a clear error, never dropped; a reasoning summary is
reasoning (tests/adapters/test_reasoning.py).
The golden pairs (golden/<client>-to-responses/) hold the exact translations of the common cases."""

from __future__ import annotations

import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from adapters import responses
from adapters.internal import (
    ChatRequest,
    Message,
    ResponseFormat,
    StreamEnd,
    StreamError,
    StreamUntranslatable,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallStart,
    ToolChoice,
    ToolDef,
    UsageUpdate,
)
from adapters.registry import translate_stream
from adapters.sse import SSEFramer
from contracts.errors import ClientError
from devstack.demo.responses_server import (
    CUSTOM_TOOL,
    EXTRA_ITEMS,
    REASONING,
    WEB_SEARCH,
    _stream_with_item_first,
    _with_item_first,
)
from tests.adapters.fixtures import RESPONSES, SCHEMA, STREAMS
from tests.adapters.translation_checks import NAMES, client_events, decode, parse, summary

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
U = Message("user", (TextPart("hi"),))
TEXT_ANSWER = RESPONSES["responses"]["text"]


def _rendered(req: ChatRequest) -> dict:
    up = responses.render_request(req, upstream_model="gpt-up", credential="sk-up")
    assert up.path == "/v1/responses" and up.headers["authorization"] == "Bearer sk-up"
    return orjson.loads(up.body)


# ---- requests ----------------------------------------------------------------------------------


def test_chat_request_becomes_a_responses_request() -> None:
    req = ChatRequest("m", (U,), system="be brief", tools=(ToolDef("f", "does f", SCHEMA),),
                      tool_choice=ToolChoice("tool", "f"), temperature=0.2, top_p=0.5, max_tokens=64, stream=True,
                      response_format=ResponseFormat("json_schema", SCHEMA, "city", True))
    body = _rendered(req)
    assert body == {
        "model": "gpt-up", "store": False, "instructions": "be brief", "stream": True,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "tools": [{"type": "function", "name": "f", "description": "does f", "parameters": SCHEMA}],
        "tool_choice": {"type": "function", "name": "f"}, "temperature": 0.2, "top_p": 0.5,
        "max_output_tokens": 64,
        "text": {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}}


@pytest.mark.parametrize("client", NAMES)
def test_stop_sequences_are_refused_naming_them(client: str) -> None:
    body = {"openai": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stop": ["END"]},
            "anthropic": {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}],
                          "stop_sequences": ["END"]},
            "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                       "generationConfig": {"stopSequences": ["END"]}}}[client]
    with pytest.raises(ClientError, match="stop sequences cannot be sent to a Responses API upstream") as e:
        responses.render_request(parse(client, orjson.dumps(body)), upstream_model="u", credential=None)
    assert e.value.status == 400


# ---- whole answers -----------------------------------------------------------------------------

UNTRANSLATABLE = [
    ("web search", EXTRA_ITEMS[WEB_SEARCH], "a web_search_call output item"),
    ("file search", {"type": "file_search_call", "id": "fs_1", "status": "completed", "queries": ["q"]},
     "a file_search_call output item"),
    ("custom tool", EXTRA_ITEMS[CUSTOM_TOOL], "a custom_tool_call output item"),
    ("code interpreter", {"type": "code_interpreter_call", "id": "ci_1", "status": "completed", "code": "1",
                          "container_id": "c", "outputs": []}, "a code_interpreter_call output item"),
    ("unknown item", {"type": "hologram", "id": "h"}, "a hologram output item"),
]


@pytest.mark.parametrize(("case", "item", "what"), UNTRANSLATABLE, ids=[c[0] for c in UNTRANSLATABLE])
def test_an_answer_with_untranslatable_output_says_so(case: str, item: dict, what: str) -> None:
    raw = _with_item_first(orjson.dumps(TEXT_ANSWER), item)
    resp = responses.parse_response(raw)
    assert resp.untranslatable is not None and what in resp.untranslatable
    assert "POST /v1/responses" in resp.untranslatable
    # Everything else is still read: a passthrough caller is metered from it.
    assert resp.content == "Hello there" and (resp.usage.input_tokens, resp.usage.output_tokens) == (11, 2)


def test_an_unknown_message_part_is_untranslatable() -> None:
    obj = orjson.loads(orjson.dumps(TEXT_ANSWER))
    obj["output"][0]["content"].append({"type": "output_audio", "data": "AA"})
    assert "a message part of type output_audio" in (responses.parse_response(orjson.dumps(obj)).untranslatable or "")


def test_hidden_reasoning_translates_to_nothing() -> None:
    resp = responses.parse_response(_with_item_first(orjson.dumps(TEXT_ANSWER), EXTRA_ITEMS[REASONING]))
    assert resp.untranslatable is None and resp.content == "Hello there"
    assert responses.parse_response(orjson.dumps(RESPONSES["responses"]["tool"])).untranslatable is None


def test_an_answer_the_sdk_accepts_is_what_we_read() -> None:
    for kind, body in RESPONSES["responses"].items():
        sdk = Response.model_validate(body)
        ours = responses.parse_response(orjson.dumps(body))
        assert ours.content == sdk.output_text, kind
        assert [(c.id, c.name, c.arguments) for c in ours.tool_calls] == [
            (o.call_id, o.name, o.arguments) for o in sdk.output if o.type == "function_call"]


# ---- streams -----------------------------------------------------------------------------------


def _demo_stream(item: dict) -> bytes:
    """The demo upstream's stream: text "Hello there", with `item` as output 0."""
    raw = responses.StreamEncoder(model="m").encode(decode("responses", [STREAMS["responses"]["text"]]))
    return _stream_with_item_first(raw, item)


def test_the_demo_streams_valid_sdk_events() -> None:
    for item in EXTRA_ITEMS.values():
        f = SSEFramer()
        evs = [EVENTS.validate_python(orjson.loads(e.data)) for e in f.feed(_demo_stream(item)) + f.close()]
        assert [e.sequence_number for e in evs] == list(range(len(evs)))
        assert evs[-1].type == "response.completed" and evs[-1].response.output[0].type == item["type"]


@pytest.mark.parametrize(("case", "item", "what"), UNTRANSLATABLE[:4], ids=[c[0] for c in UNTRANSLATABLE[:4]])
def test_a_stream_with_untranslatable_output_ends_in_an_error_after_its_usage(case: str, item: dict,
                                                                             what: str) -> None:
    raw = _demo_stream(item)
    events = decode("responses", [raw[i:i + 9] for i in range(0, len(raw), 9)])
    last = events[-1]
    assert isinstance(last, StreamUntranslatable) and what in last.message
    assert sum(isinstance(e, (StreamEnd, StreamError)) for e in events) == 1
    # A web search ran (and is billed) whether or not its answer can be translated.
    assert events[-2] == UsageUpdate(11, 2, web_searches=1 if item["type"] == "web_search_call" else None)
    # Nothing after the item is passed on as if it were the whole answer.
    assert not [e for e in events if isinstance(e, TextDelta)]


def test_hidden_reasoning_streams_through() -> None:
    text, calls, finish, i, o, ended = summary(decode("responses", [_demo_stream(EXTRA_ITEMS[REASONING])]))
    assert (text, calls, finish, i, o, ended) == ("Hello there", [], "stop", 11, 2, True)


@pytest.mark.parametrize("client", NAMES)
def test_each_chat_client_gets_the_error_in_its_own_stream_shape(client: str) -> None:
    tr = translate_stream("responses", client, ChatRequest("m", (U,), stream=True, include_usage=True))
    out = tr.feed(_demo_stream(EXTRA_ITEMS[WEB_SEARCH])) + tr.finish()
    assert tr.error is not None and "web_search_call" in tr.error and not tr.finished
    assert (tr.meter.reported.input_tokens, tr.meter.reported.output_tokens) == (11, 2)  # metered all the same
    evs = client_events(client, out)
    err = evs[-1] if client != "openai" else next(e for e in evs if "error" in e)
    text = orjson.dumps(err).decode()
    assert "web_search_call" in text and "POST /v1/responses" in text


def _sse(events: list[dict]) -> bytes:
    return b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)


_CREATED = {"type": "response.created", "response": {"id": "resp_x", "model": "gpt-up", "status": "in_progress",
                                                      "output": []}}


def _done(status: str = "completed", **extra: object) -> dict:
    return {"type": f"response.{status}", "response": {"id": "resp_x", "status": status, "output": [],
                                                       "usage": {"input_tokens": 3, "output_tokens": 4}, **extra}}


def test_arguments_and_text_that_come_only_whole_are_not_lost() -> None:
    call = {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": '{"a":1}'}
    events = decode("responses", [_sse([
        _CREATED,
        {"type": "response.output_item.added", "output_index": 0, "item": {**call, "arguments": ""}},
        {"type": "response.output_item.done", "output_index": 0, "item": call},
        {"type": "response.output_text.done", "item_id": "msg_2", "output_index": 1, "content_index": 0,
         "text": "after"},
        _done()])])
    assert ToolCallStart(0, "call_1", "f") in events and ToolCallDelta(0, '{"a":1}') in events
    assert TextDelta("after") in events
    # Deltas already streamed are not repeated by their done event.
    streamed = decode("responses", [STREAMS["responses"]["tool"]])
    assert "".join(e.arguments for e in streamed if isinstance(e, ToolCallDelta)) == '{"city":"Paris"}'


@pytest.mark.parametrize(("events", "expected"), [
    ([_CREATED, {"type": "error", "code": "server_error", "message": "The server had an error", "param": None}],
     "The server had an error"),
    ([_CREATED, _done("failed", error={"code": "server_error", "message": "model crashed"})], "model crashed"),
    ([_CREATED, {"type": "response.output_text.delta", "item_id": "m", "content_index": 0, "delta": "Hel"}],
     "ended before response.completed"),
], ids=["error event", "response.failed", "cut"])
def test_stream_failures_are_errors(events: list, expected: str) -> None:
    got = decode("responses", [_sse(events)])
    assert type(got[-1]) is StreamError and expected in got[-1].message


def test_an_incomplete_stream_finishes_for_length() -> None:
    got = summary(decode("responses", [_sse([_CREATED, _done("incomplete",
                                                             incomplete_details={"reason": "max_output_tokens"})])]))
    assert got[2:] == ("length", 3, 4, True)


def test_a_tool_result_with_an_image_keeps_it_as_input_parts() -> None:
    from openai.types.responses.response_input_item import FunctionCallOutput

    req = parse("anthropic", orjson.dumps({"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "here"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA="}}]}]}]}))
    item = _rendered(req)["input"][-1]
    assert item["output"] == [{"type": "input_text", "text": "here"},
                              {"type": "input_image", "image_url": "data:image/png;base64,AAA="}]
    FunctionCallOutput.model_validate(item)


# ---- the demo Responses upstream, driven by the openai SDK -------------------------------------


async def test_the_demo_upstream_with_the_sdk() -> None:
    import openai as openai_sdk
    from aiohttp.test_utils import TestServer

    from devstack.demo import responses_server

    async with TestServer(responses_server.make_app(require_key="rk-1"), host="127.0.0.1") as srv:
        url = str(srv.make_url("/v1")).rstrip("/")
        client = openai_sdk.AsyncOpenAI(api_key="rk-1", base_url=url, max_retries=0)
        r = await client.responses.create(model="gpt-x", instructions="be brief", input="hello demo")
        assert r.output_text == "[demo-responses] echo: hello demo" and r.instructions == "be brief"
        assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens) == (4, 4)
        tool = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
        async with client.responses.stream(model="gpt-x", input="weather in Oslo", tools=[tool]) as s:
            final = await s.get_final_response()
        call = next(o for o in final.output if o.type == "function_call")
        assert call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Oslo"}
        # The SDK's own stream state machine accepts the events with an extra item first.
        async with client.responses.stream(model="gpt-x", input=f"find {WEB_SEARCH}") as s:
            final = await s.get_final_response()
        assert [o.type for o in final.output] == ["web_search_call", "message"]
        with pytest.raises(openai_sdk.AuthenticationError):
            await openai_sdk.AsyncOpenAI(api_key="wrong", base_url=url, max_retries=0).responses.create(
                model="gpt-x", input=f"find {WEB_SEARCH}")
        await client.close()
