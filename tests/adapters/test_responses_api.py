"""The Responses API adapter (adapters/responses.py): request items -> internal turns, answers and
typed stream events <- internal, checked against the `openai` SDK's own types, table-driven."""

from __future__ import annotations

import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from adapters import responses
from adapters.internal import (
    ChatRequest,
    ChatResponse,
    DocumentPart,
    ImagePart,
    Message,
    ResponseFormat,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolChoice,
    ToolDef,
    Usage,
    UsageUpdate,
)
from adapters.registry import ClientRoute, detect_client_protocol, translate_stream
from adapters.sse import SSEFramer
from contracts.errors import ClientError, UpstreamError
from tests.adapters.fixtures import SCHEMA, STREAMS

EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
TOOL = {"type": "function", "name": "get_weather", "description": "Weather by city", "parameters": SCHEMA}
U = Message("user", (TextPart("hi"),))


def _req(**body: object) -> ChatRequest:
    return responses.parse_request(orjson.dumps({"model": "m", **body}))


# ---- request: (case, body fields, what the internal request holds) -------------------------

PARSE_CASES = [
    ("string input", {"input": "hi"}, {"messages": (U,), "system": None}),
    ("instructions become the system prompt", {"input": "hi", "instructions": "be brief"},
     {"system": "be brief"}),
    ("system and developer items are hoisted after instructions",
     {"instructions": "A", "input": [{"role": "developer", "content": "B"},
                                     {"role": "system", "content": [{"type": "input_text", "text": "C"}]},
                                     {"role": "user", "content": "hi"}]},
     {"system": "A\n\nB\n\nC", "messages": (U,)}),
    ("typed message item with parts",
     {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look"},
                                                                 {"type": "input_image",
                                                                  "image_url": "data:image/png;base64,AAA="}]}]},
     {"messages": (Message("user", (TextPart("look"), ImagePart("image/png", "AAA="))),)}),
    ("image by url", {"input": [{"role": "user", "content": [{"type": "input_image",
                                                               "image_url": "https://x/y.png"}]}]},
     {"messages": (Message("user", (ImagePart(url="https://x/y.png"),)),)}),
    ("function call and its output, name carried for Gemini",
     {"input": [{"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]},
     {"messages": (Message("user", (TextPart("weather?"),)),
                   Message("assistant", (), (ToolCall("c1", "get_weather", '{"city":"Paris"}'),)),
                   Message("tool", (TextPart("sunny"),), tool_call_id="c1", name="get_weather"))}),
    ("an assistant message and the calls after it are one turn",
     {"input": [{"role": "user", "content": "go"},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "calling", "annotations": []}]},
                {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "b", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "B"}]},
                {"type": "function_call_output", "call_id": "a", "output": "A"}]},
     {"messages": (Message("user", (TextPart("go"),)),
                   Message("assistant", (TextPart("calling"),), (ToolCall("a", "f", "{}"), ToolCall("b", "g", "{}"))),
                   Message("tool", (TextPart("B"),), tool_call_id="b", name="g"),
                   Message("tool", (TextPart("A"),), tool_call_id="a", name="f"))}),
    ("function tools and a forced tool", {"input": "hi", "tools": [TOOL],
                                          "tool_choice": {"type": "function", "name": "get_weather"}},
     {"tools": (ToolDef("get_weather", "Weather by city", SCHEMA),), "tool_choice": ToolChoice("tool", "get_weather")}),
    ("required tool choice", {"input": "hi", "tools": [TOOL], "tool_choice": "required"},
     {"tool_choice": ToolChoice("required")}),
    ("sampling and limits", {"input": "hi", "temperature": 0.2, "top_p": 0.5, "max_output_tokens": 64,
                             "stream": True},
     {"temperature": 0.2, "top_p": 0.5, "max_tokens": 64, "stream": True}),
    ("harmless options are accepted", {"input": "hi", "store": False, "metadata": {"k": "v"}, "user": "u",
                                       "truncation": "disabled", "text": {"format": {"type": "text"}},
                                       "reasoning": {}},
     {"messages": (U,), "response_format": None, "parallel_tool_calls": None}),
    ("parallel tool calls off", {"input": "hi", "tools": [TOOL], "parallel_tool_calls": False},
     {"parallel_tool_calls": False}),
    ("structured output, flat json_schema", {"input": "hi", "text": {"format": {
        "type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}}},
     {"response_format": ResponseFormat("json_schema", SCHEMA, "city", True)}),
    ("json object output", {"input": "hi", "text": {"format": {"type": "json_object"}}},
     {"response_format": ResponseFormat("json_object")}),
    ("a PDF by data URL, and by link", {"input": [{"role": "user", "content": [
        {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBER"},
        {"type": "input_file", "file_url": "https://x/b.pdf"}]}]},
     {"messages": (Message("user", (DocumentPart("application/pdf", "JVBER", name="a.pdf"),
                                    DocumentPart("application/pdf", url="https://x/b.pdf"))),)}),
    ("a Gemini thought signature riding in a call id is read back",
     {"input": [{"role": "user", "content": "go"},
                {"type": "function_call", "call_id": "call_1__ts_c2ln", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1__ts_c2ln", "output": "ok"}]},
     {"messages": (Message("user", (TextPart("go"),)),
                   Message("assistant", (), (ToolCall("call_1__ts_c2ln", "f", "{}", "c2ln"),)),
                   Message("tool", (TextPart("ok"),), tool_call_id="call_1__ts_c2ln", name="f"))}),
]


@pytest.mark.parametrize(("case", "fields", "expected"), PARSE_CASES, ids=[c[0] for c in PARSE_CASES])
def test_parse_request(case: str, fields: dict, expected: dict) -> None:
    req = _req(**fields)
    for name, value in expected.items():
        assert getattr(req, name) == value, name


REJECT_CASES = [
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id is not supported"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation is not supported"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference needs stored items"),
    ({"input": "hi", "tools": [{"type": 3}]}, "only function tools"),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "hi", "parallel_tool_calls": "no"}, "parallel_tool_calls must be a boolean"),
    ({"input": "hi", "background": True}, "background"),
    ({}, "input is required"),
    ({"input": []}, "input is required"),
    ({"input": [{"role": "system", "content": "only a system prompt"}]}, "at least one"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "uploaded files"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_url": "https://x/a.docx"}]}]},
     "input_file needs"),
    ({"input": [{"role": "assistant", "content": [{"type": "input_file", "file_data": "data:a/b;base64,AA"}]}]},
     "'input_file' is not supported here"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "image_url is required"),
    ({"input": [{"role": "tool", "content": "x"}]}, "role 'tool'"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "call_id is required"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]}, "arguments must be"),
    ({"input": "hi", "tool_choice": {"type": "allowed_tools"}}, "tool_choice must be"),
    ({"input": "hi", "temperature": 3}, "temperature"),
]


@pytest.mark.parametrize(("fields", "message"), REJECT_CASES, ids=[c[1] for c in REJECT_CASES])
def test_parse_request_rejects_with_a_clear_400(fields: dict, message: str) -> None:
    with pytest.raises(ClientError) as e:
        _req(**fields)
    assert e.value.status == 400 and message in e.value.message


# What only a Responses deployment can take: parsed, noted, passed through there (a 400 elsewhere:
# tests/core/test_responses_upstream_session.py).
NATIVE_CASES = [
    ({"input": [{"role": "user", "content": "hi"}, {"type": "reasoning", "id": "rs_1", "summary": [],
                                                   "encrypted_content": "gAAA"}]}, "reasoning items"),
    ({"input": "hi", "tools": [{"type": "web_search"}, TOOL]}, "web_search tools"),
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}],
      "tool_choice": {"type": "file_search"}}, "file_search tools, a file_search tool_choice"),
    ({"input": "hi", "reasoning": {"effort": "high"}}, "reasoning options"),
]


@pytest.mark.parametrize(("fields", "native"), NATIVE_CASES, ids=[c[1] for c in NATIVE_CASES])
def test_what_only_a_responses_deployment_takes_is_noted(fields: dict, native: str) -> None:
    req = _req(**fields)
    assert req.native_only == native and req.messages == (U,)
    assert [t.name for t in req.tools] == (["get_weather"] if TOOL in fields.get("tools", ()) else [])
    assert _req(input="hi").native_only is None


def test_model_is_required_and_the_route_is_detected() -> None:
    with pytest.raises(ClientError):
        responses.parse_request(b'{"input": "hi"}')
    assert detect_client_protocol("POST", "/v1/responses") == ClientRoute("responses")
    assert detect_client_protocol("GET", "/v1/responses") is None


def test_render_request_round_trips() -> None:
    req = _req(**PARSE_CASES[6][1], instructions="sys", tools=[TOOL], tool_choice="auto", temperature=0.3,
               max_output_tokens=9, stream=True, parallel_tool_calls=False,
               text={"format": {"type": "json_schema", "name": "n", "schema": SCHEMA, "strict": True}})
    up = responses.render_request(req, upstream_model="up-model", credential="k")
    assert up.path == "/v1/responses" and up.headers["authorization"] == "Bearer k"
    body = orjson.loads(up.body)
    assert body["model"] == "up-model" and body["store"] is False and body["stream"] is True
    back = responses.parse_request(up.body)
    for name in ("messages", "system", "tools", "tool_choice", "temperature", "max_tokens", "stream",
                 "parallel_tool_calls", "response_format"):
        assert getattr(back, name) == getattr(req, name), name


# ---- whole answers -------------------------------------------------------------------------

RESPONSE_CASES = [
    ("text", ChatResponse("x", "up", "Hello", (), "stop", Usage(3, 2)), "completed", None),
    ("tool calls", ChatResponse("x", "up", "", (ToolCall("c1", "f", '{"a":1}'), ToolCall("c2", "g", "{}")),
                                "tool_calls", Usage(5, 7)), "completed", None),
    ("text and a call", ChatResponse("x", "up", "let me see", (ToolCall("c1", "f", "{}"),), "tool_calls",
                                     Usage(1, 1)), "completed", None),
    ("length", ChatResponse("x", "up", "Hel", (), "length", Usage(5, 1)), "incomplete", "max_output_tokens"),
    ("content filter", ChatResponse("x", "up", "", (), "content_filter", Usage(5, 0)), "incomplete",
     "content_filter"),
    ("error", ChatResponse("x", "up", "", (), "error", Usage(5, 0)), "failed", None),
]


@pytest.mark.parametrize(("case", "resp", "status", "incomplete"), RESPONSE_CASES, ids=[c[0] for c in RESPONSE_CASES])
def test_render_response_is_a_valid_sdk_response(case: str, resp: ChatResponse, status: str,
                                                 incomplete: str | None) -> None:
    raw = responses.render_response(resp, model="client-model")
    out = Response.model_validate(orjson.loads(raw))
    assert out.id.startswith("resp_") and out.model == "client-model" and out.status == status
    assert out.output_text == resp.content
    assert (out.incomplete_details.reason if out.incomplete_details else None) == incomplete
    assert (out.error is not None) == (status == "failed")
    calls = [(o.call_id, o.name, o.arguments) for o in out.output if o.type == "function_call"]
    assert calls == [(tc.id, tc.name, tc.arguments) for tc in resp.tool_calls]
    assert out.usage is not None and (out.usage.input_tokens, out.usage.output_tokens) == (
        resp.usage.input_tokens, resp.usage.output_tokens)
    back = responses.parse_response(raw)
    assert (back.content, back.tool_calls, back.finish_reason, back.usage) == (
        resp.content, resp.tool_calls, resp.finish_reason, resp.usage)


def test_render_response_echoes_the_request() -> None:
    req = _req(input="hi", instructions="sys", tools=[TOOL], temperature=0.5, max_output_tokens=7)
    out = orjson.loads(responses.render_response(ChatResponse("x", "up", "ok"), model="m", request=req))
    assert out["instructions"] == "sys" and out["temperature"] == 0.5 and out["max_output_tokens"] == 7
    assert out["tools"][0]["name"] == "get_weather"


@pytest.mark.parametrize("raw", [b"not json", b'{"id": "r"}', b'{"output": [1]}',
                                 b'{"output": [{"type": "function_call", "name": 3}]}'], ids=[
    "not-json", "no-output", "output-not-items", "call-name-not-string"
])
def test_parse_response_rejects_unreadable_upstream(raw: bytes) -> None:
    with pytest.raises(UpstreamError):
        responses.parse_response(raw)


# ---- streams -------------------------------------------------------------------------------


def _events(raw: bytes) -> list:
    """Every SSE event parsed by the SDK's own event union; the SSE `event:` matches its type."""
    out = []
    for ev in SSEFramer().feed(raw):
        obj = orjson.loads(ev.data)
        assert ev.event == obj["type"]
        out.append(EVENTS.validate_python(obj))
    return out


def _encode(events: list[StreamEvent], request: ChatRequest | None = None, *, one_by_one: bool = True) -> list:
    enc = responses.StreamEncoder(model="client-model", request=request)
    raw = b"".join(enc.encode([e]) for e in events) if one_by_one else enc.encode(events)
    return _events(raw)


TEXT = [UsageUpdate(4, 0), StreamStart("up-1", "up"), TextDelta("Hel"), TextDelta("lo"), StreamFinish("stop"),
        UsageUpdate(4, 2), StreamEnd()]
PARALLEL = [StreamStart("up-2", "up"), TextDelta("checking"), ToolCallStart(0, "c0", "f"), ToolCallStart(1, "c1", "g"),
            ToolCallDelta(1, '{"b"'), ToolCallDelta(0, '{"a"'), ToolCallDelta(0, ":1}"), ToolCallDelta(1, ":2}"),
            StreamFinish("tool_calls"), UsageUpdate(9, 5), StreamEnd()]
LENGTH = [StreamStart("up-3", "up"), TextDelta("Hel"), StreamFinish("length"), StreamEnd()]
BROKEN = [StreamStart("up-4", "up"), TextDelta("Hel"), StreamError("upstream went away")]
STREAM_CASES = [
    ("text", TEXT, "response.completed", "Hello", [], (4, 2)),
    ("parallel interleaved calls", PARALLEL, "response.completed", "checking",
     [("c0", "f", '{"a":1}'), ("c1", "g", '{"b":2}')], (9, 5)),
    ("length", LENGTH, "response.incomplete", "Hel", [], (0, 0)),
    ("upstream error", BROKEN, "response.failed", "Hel", [], (0, 0)),
]


@pytest.mark.parametrize("one_by_one", [True, False])
@pytest.mark.parametrize(("case", "events", "last", "text", "calls", "usage"), STREAM_CASES,
                         ids=[c[0] for c in STREAM_CASES])
def test_stream_encoder_typed_events(case: str, events: list, last: str, text: str, calls: list,
                                     usage: tuple, one_by_one: bool) -> None:
    out = _encode(events, one_by_one=one_by_one)
    types = [e.type for e in out]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == last
    assert [e.sequence_number for e in out] == list(range(len(out)))
    assert "".join(e.delta for e in out if e.type == "response.output_text.delta") == text
    final = out[-1].response
    assert final.output_text == text
    assert [(o.call_id, o.name, o.arguments) for o in final.output if o.type == "function_call"] == calls
    if last != "response.failed":
        assert (final.usage.input_tokens, final.usage.output_tokens) == usage
    else:
        assert final.error is not None and final.error.message == "upstream went away"
    # Every item is added before its deltas and done before the response ends, deltas included.
    added, done = {}, {}
    for i, e in enumerate(out):
        if e.type == "response.output_item.added":
            added[e.item.id] = i
        elif e.type == "response.output_item.done":
            done[e.item.id] = i
        elif e.type in ("response.output_text.delta", "response.function_call_arguments.delta"):
            assert added[e.item_id] < i and e.item_id not in done
    assert set(added) == set(done) and [o.id for o in final.output] == sorted(done, key=lambda k: added[k])


def test_stream_function_call_arguments_done_per_call() -> None:
    out = _encode(PARALLEL)
    dones = {e.item_id: e.arguments for e in out if e.type == "response.function_call_arguments.done"}
    items = {e.item.id: e.item.call_id for e in out if e.type == "response.output_item.added"
             and e.item.type == "function_call"}
    assert {items[k]: v for k, v in dones.items()} == {"c0": '{"a":1}', "c1": '{"b":2}'}


@pytest.mark.parametrize("upstream", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("kind", ["text", "tool"])
def test_every_upstream_stream_to_responses(upstream: str, kind: str) -> None:
    req = ChatRequest("client-model", (U,), stream=True)
    t = translate_stream(upstream, "responses", req)
    raw = STREAMS[upstream][kind]
    out = b"".join(t.feed(raw[i:i + 7]) for i in range(0, len(raw), 7)) + t.finish()
    evs = _events(out)
    assert evs[-1].type == "response.completed" and t.finished
    final = evs[-1].response
    if kind == "text":
        assert final.output_text == "Hello there" and (final.usage.input_tokens, final.usage.output_tokens) == (11, 2)
    else:
        call = next(o for o in final.output if o.type == "function_call")
        assert call.name == "get_weather" and orjson.loads(call.arguments) == {"city": "Paris"}
        assert (final.usage.input_tokens, final.usage.output_tokens) == (20, 7)


@pytest.mark.parametrize(("case", "events", "last", "text", "calls", "usage"), STREAM_CASES[:3],
                         ids=[c[0] for c in STREAM_CASES[:3]])
def test_stream_decoder_reads_what_the_encoder_writes(case: str, events: list, last: str, text: str,
                                                      calls: list, usage: tuple) -> None:
    enc = responses.StreamEncoder(model="m")
    raw = enc.encode(events)
    dec = responses.StreamDecoder()
    got = [e for i in range(0, len(raw), 5) for e in dec.feed(raw[i:i + 5])] + dec.close()
    assert "".join(e.text for e in got if isinstance(e, TextDelta)) == text
    starts = {e.index: e for e in got if isinstance(e, ToolCallStart)}
    args = {i: "".join(e.arguments for e in got if isinstance(e, ToolCallDelta) and e.index == i) for i in starts}
    assert [(starts[i].id, starts[i].name, args[i]) for i in sorted(starts)] == calls
    assert isinstance(got[-1], StreamEnd)
    assert [e for e in got if isinstance(e, UsageUpdate)][-1] == UsageUpdate(*usage)


def test_stream_decoder_cut_and_failed() -> None:
    dec = responses.StreamDecoder()
    raw = responses.StreamEncoder(model="m").encode(TEXT[:4])
    assert isinstance((dec.feed(raw) + dec.close())[-1], StreamError)
    dec = responses.StreamDecoder()
    got = dec.feed(responses.StreamEncoder(model="m").encode(BROKEN))
    assert isinstance(got[-1], StreamError) and got[-1].message == "upstream went away"


def test_render_request_strips_carried_signatures_and_refuses_top_k() -> None:
    req = _req(**PARSE_CASES[-1][1])
    body = orjson.loads(responses.render_request(req, upstream_model="u", credential=None).body)
    assert [i.get("call_id") for i in body["input"] if "call_id" in i] == ["call_1", "call_1"]
    with pytest.raises(ClientError, match="top_k"):
        responses.render_request(ChatRequest("m", (U,), top_k=3), upstream_model="u", credential=None)


def test_refusal_whole_and_streamed() -> None:
    resp = ChatResponse("x", "up", "", (), "content_filter", Usage(3, 2), refusal="I can't help with that")
    out = Response.model_validate(orjson.loads(responses.render_response(resp, model="m")))
    assert [c.type for c in out.output[0].content] == ["refusal"]
    assert out.status == "completed" and out.incomplete_details is None  # as OpenAI answers a refusal
    assert out.output[0].content[0].refusal == "I can't help with that"
    back = responses.parse_response(responses.render_response(resp, model="m"))
    assert back.refusal == resp.refusal and back.finish_reason == "content_filter"
    evs = _encode([StreamStart("r", "u"), TextDelta("Sure: "), TextDelta("no", refusal=True),
                   TextDelta("pe", refusal=True), StreamFinish("content_filter"), StreamEnd()])
    types = [e.type for e in evs]
    assert types.count("response.content_part.added") == 2 and "response.refusal.done" in types
    assert "".join(e.delta for e in evs if e.type == "response.refusal.delta") == "nope"
    assert evs[-1].type == "response.completed"
    item = evs[-1].response.output[0]
    assert [(c.type, getattr(c, "text", None) or getattr(c, "refusal", None)) for c in item.content] == [
        ("output_text", "Sure: "), ("refusal", "nope")]
    dec = responses.StreamDecoder()
    raw = responses.StreamEncoder(model="m").encode([TextDelta("x", refusal=True), StreamEnd()])
    assert TextDelta("x", refusal=True) in dec.feed(raw)


def test_call_ids_carry_gemini_signatures_out() -> None:
    resp = ChatResponse("x", "up", "", (ToolCall("call_7", "f", "", "c2ln"),), "tool_calls")
    out = Response.model_validate(orjson.loads(responses.render_response(resp, model="m")))
    assert out.output[0].call_id == "call_7__ts_c2ln" and out.output[0].arguments == "{}"
    evs = _encode([ToolCallStart(0, "call_7", "f", "c2ln"), StreamFinish("tool_calls"), StreamEnd()])
    added = next(e for e in evs if e.type == "response.output_item.added")
    assert added.item.call_id == "call_7__ts_c2ln" and added.item.arguments == ""
    # No argument deltas came: "{}" is streamed, so deltas, done and the whole answer agree.
    assert [e.delta for e in evs if e.type == "response.function_call_arguments.delta"] == ["{}"]
    assert evs[-1].response.output[0].arguments == "{}"


def test_response_echoes_structured_output_and_parallel_setting() -> None:
    req = _req(input="hi", tools=[TOOL], parallel_tool_calls=False,
               text={"format": {"type": "json_schema", "name": "n", "schema": SCHEMA}})
    out = Response.model_validate(orjson.loads(responses.render_response(ChatResponse("x", "u", "{}"), model="m",
                                                                         request=req)))
    assert out.parallel_tool_calls is False and out.text.format.type == "json_schema"
