"""One focused test per translation defect of issue 13 (recorded-traffic fidelity)."""

from __future__ import annotations

import base64
import dataclasses

import anthropic as anthropic_sdk
import openai as openai_sdk
import orjson
import pytest

from adapters import anthropic, gemini, openai
from adapters.injected_usage import InjectedUsageFilter
from adapters.internal import (
    ChatRequest,
    DocumentPart,
    ImagePart,
    Message,
    RenderOptions,
    ResponseFormat,
    StreamEnd,
    StreamFinish,
    StreamStart,
    TextPart,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    ToolDef,
    UsageUpdate,
)
from adapters.registry import PROTOCOLS, translate_stream
from contracts.errors import ClientError, UpstreamError
from tests.adapters.conformance.recorded import RECORDED, sse_from_chunks
from tests.adapters.fixtures import CANONICAL, SCHEMA, body
from tests.adapters.sdk_streams import anthropic_message, openai_chunks, openai_completion

STREAM_REQ = ChatRequest("client-model", (Message("user", (TextPart("hi"),)),), stream=True)
WEATHER = ToolDef("get_weather", "Weather by city", SCHEMA)


def render(upstream: str, req: ChatRequest, **kw: object) -> dict:
    return orjson.loads(PROTOCOLS[upstream].render_request(req, upstream_model="up", credential=None, **kw).body)


def translate(upstream: str, client: str, raw: bytes, req: ChatRequest = STREAM_REQ, step: int = 7) -> bytes:
    tr = translate_stream(upstream, client, req)
    return b"".join(tr.feed(raw[i:i + step]) for i in range(0, len(raw), step)) + tr.finish()


# -- max_tokens -> max_completion_tokens ---------------------------------------------------------

def test_openai_upstream_gets_max_completion_tokens_unless_the_deployment_opts_out() -> None:
    assert render("openai", CANONICAL)["max_completion_tokens"] == 100
    assert "max_tokens" not in render("openai", CANONICAL)
    legacy = render("openai", CANONICAL, options=RenderOptions(legacy_max_tokens=True))
    assert legacy["max_tokens"] == 100 and "max_completion_tokens" not in legacy
    # Both spellings from an OpenAI client mean the same cap.
    for field in ("max_tokens", "max_completion_tokens"):
        req = openai.parse_request(body({"model": "m", "messages": [{"role": "user", "content": "x"}], field: 9}))
        assert req.max_tokens == 9


# -- Gemini thought signatures -----------------------------------------------------------------

SIGNED = {"candidates": [{"content": {"role": "model", "parts": [
    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2lnLTE="},
    {"functionCall": {"name": "get_weather", "args": {"city": "Lima"}}}]}, "finishReason": "STOP"}],
    "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3}, "responseId": "r-1", "modelVersion": "gemini-3"}


def test_thought_signatures_survive_a_gemini_round_trip_and_streams() -> None:
    resp = gemini.parse_response(body(SIGNED))
    assert [tc.signature for tc in resp.tool_calls] == ["c2lnLTE=", None]
    out = orjson.loads(gemini.render_response(resp, model="m"))["candidates"][0]["content"]["parts"]
    assert out[0]["thoughtSignature"] == "c2lnLTE=" and "thoughtSignature" not in out[1]
    # A Gemini client's history replayed to a Gemini upstream keeps its signature verbatim.
    history = {"contents": [{"role": "user", "parts": [{"text": "weather?"}]},
                            {"role": "model", "parts": out},
                            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather",
                                                                             "response": {"output": "sunny"}}}]}]}
    req = gemini.parse_request(body(history), path_model="m")
    parts = render("gemini", req)["contents"][1]["parts"]
    assert parts[0]["thoughtSignature"] == "c2lnLTE=" and "thoughtSignature" not in parts[1]
    # Streamed: the signature rides on the call through the decoder and the Gemini encoder.
    raw = b"data: " + body(SIGNED) + b"\r\n\r\n"
    chunks = [orjson.loads(line[6:]) for line in translate("gemini", "gemini", raw).split(b"\r\n\r\n") if line]
    streamed = chunks[-1]["candidates"][0]["content"]["parts"]
    assert streamed[0]["thoughtSignature"] == "c2lnLTE="


def test_history_from_another_protocol_gets_googles_stand_in_signature() -> None:
    calls = (ToolCall("call_a", "get_weather", '{"city":"Paris"}'), ToolCall("call_b", "get_weather", '{"city":"Lima"}'))
    req = ChatRequest("m", (Message("user", (TextPart("weather?"),)), Message("assistant", (), calls),
                            Message("tool", (TextPart("sunny"),), tool_call_id="call_a"),
                            Message("tool", (TextPart("rain"),), tool_call_id="call_b")), tools=(WEATHER,))
    parts = render("gemini", req)["contents"][1]["parts"]
    # Gemini 3 validates the first call of a turn only; the parallel one carries none.
    assert parts[0]["thoughtSignature"] == gemini.SKIP_SIGNATURE == "skip_thought_signature_validator"
    assert "thoughtSignature" not in parts[1]


# -- same protocol, injected usage: upstream bytes less one chunk ----------------------------------

def _events(raw: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def test_injected_usage_chunk_is_the_only_thing_removed() -> None:
    raw = RECORDED["aig-cassette-chat-streaming-detailed-usage.sse"]
    f = InjectedUsageFilter()
    out = b"".join(f.feed(raw[i:i + 13]) for i in range(0, len(raw), 13)) + f.finish()
    kept = [e for e in _events(raw) if b'"choices":[]' not in e]
    assert len(kept) == len(_events(raw)) - 1
    assert out == b"".join(kept)  # byte for byte: obfuscation, service_tier, usage:null all intact
    assert f.finished and f.error is None
    assert (f.meter.reported.input_tokens, f.meter.reported.output_tokens) == (12, 100)
    chunks = openai_chunks(out)
    assert chunks[0].service_tier == "default" and all(c.usage is None for c in chunks)


def test_injected_usage_filter_keeps_fields_the_internal_format_does_not_know() -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "system_fingerprint": "fp_1",
             "choices": [{"index": 0, "delta": {"content": "Hi", "reasoning_content": "think",
                                                "annotations": [{"type": "url_citation"}]},
                          "logprobs": {"content": [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105],
                                                    "top_logprobs": []}]}, "finish_reason": None}]}
    usage = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
             "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}
    raw = b"data: " + body(chunk) + b"\r\n\r\ndata: " + body(usage) + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    f = InjectedUsageFilter()
    out = b"".join(f.feed(raw[i:i + 1]) for i in range(len(raw))) + f.finish()
    assert out == b"data: " + body(chunk) + b"\r\n\r\ndata: [DONE]\r\n\r\n"
    assert f.meter.reported.input_tokens == 3
    # A cut stream still ends with an error event for the client.
    cut = InjectedUsageFilter()
    tail = cut.feed(raw[:40]) + cut.finish()
    assert b'"error"' in tail and cut.error


# -- tool calls without arguments ------------------------------------------------------------------

def test_streamed_tool_call_without_arguments_is_json_like_the_plain_answer() -> None:
    sse = sse_from_chunks("anthropic", RECORDED["vai-anthropic-tool-no-args.chunks.txt"])
    _, completion = openai_completion(translate("anthropic", "openai", sse))
    streamed = completion.choices[0].message.tool_calls[0].function.arguments  # type: ignore[attr-defined]
    plain = orjson.loads(openai.render_response(
        anthropic.parse_response(body({"content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                                       "stop_reason": "tool_use"})), model="m"))
    assert streamed == plain["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == "{}"


# -- tool-call ids ------------------------------------------------------------------------------

def test_gemini_call_ids_are_unique_across_turns() -> None:
    one = gemini.parse_response(body(SIGNED))
    two = gemini.parse_response(body({**SIGNED, "responseId": "r-2"}))
    ids = [tc.id for tc in one.tool_calls + two.tool_calls]
    assert len(set(ids)) == 4
    assert gemini.parse_response(body(SIGNED)).tool_calls[0].id == one.tool_calls[0].id  # same bytes, same id


def test_replayed_duplicate_and_foreign_ids_become_unique_valid_anthropic_ids() -> None:
    turns = []
    for city in ("Paris", "Lima"):
        turns += [{"role": "user", "content": f"weather in {city}?"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                      {"id": "functions.get_weather:1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{}"}}]},
                  {"role": "tool", "tool_call_id": "call_0", "content": f"{city} sunny"},
                  {"role": "tool", "tool_call_id": "functions.get_weather:1", "content": f"{city} warm"}]
    req = openai.parse_request(body({"model": "m", "messages": turns}))
    msgs = render("anthropic", req)["messages"]
    uses = [b["id"] for m in msgs if m["role"] == "assistant" for b in m["content"]]
    results = [(b["tool_use_id"], b["content"]) for m in msgs if m["role"] == "user" and type(m["content"]) is list
               for b in m["content"] if b["type"] == "tool_result"]
    assert len(set(uses)) == 4 and all(anthropic._TOOL_ID.match(i) for i in uses)
    # Each result follows the call of its own turn.
    assert results == [(uses[0], "Paris sunny"), (uses[1], "Paris warm"), (uses[2], "Lima sunny"),
                       (uses[3], "Lima warm")]
    assert anthropic.tool_id("functions.get_weather:1") == uses[1]  # stable: the next turn maps the same


# -- dropped controls -----------------------------------------------------------------------------

JSON_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def test_response_format_reaches_gemini_and_anthropic() -> None:
    req = openai.parse_request(body({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                     "response_format": {"type": "json_schema", "json_schema": {
                                         "name": "a", "schema": JSON_SCHEMA, "strict": True}}}))
    assert req.response_format == ResponseFormat("json_schema", JSON_SCHEMA, "a", True)
    gc = render("gemini", req)["generationConfig"]
    assert gc["responseMimeType"] == "application/json" and gc["responseSchema"] == JSON_SCHEMA
    an = render("anthropic", req)
    assert an["tool_choice"] == {"type": "tool", "name": anthropic.JSON_TOOL}
    assert an["tools"][-1]["input_schema"] == JSON_SCHEMA
    # The forced tool's input comes back to the client as the JSON text of an ordinary answer.
    resp = anthropic.parse_response(body({"content": [{"type": "tool_use", "id": "t", "name": anthropic.JSON_TOOL,
                                                        "input": {"answer": "42"}}], "stop_reason": "tool_use"}))
    assert (orjson.loads(resp.content), resp.tool_calls, resp.finish_reason) == ({"answer": "42"}, (), "stop")
    json_object = dataclasses.replace(req, response_format=ResponseFormat("json_object"))
    assert render("gemini", json_object)["generationConfig"] == {"responseMimeType": "application/json"}
    assert render("openai", json_object)["response_format"] == {"type": "json_object"}
    # Gemini's own and Anthropic's own spellings parse to the same control.
    gm = gemini.parse_request(body({"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {
        "responseMimeType": "application/json", "responseJsonSchema": JSON_SCHEMA}}), path_model="m")
    assert gm.response_format == ResponseFormat("json_schema", JSON_SCHEMA)
    ap = anthropic.parse_request(body({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
                                       "output_format": {"type": "json_schema", "schema": JSON_SCHEMA}}))
    assert render("openai", ap)["response_format"]["json_schema"]["schema"] == JSON_SCHEMA


def test_structured_output_stream_from_anthropic_is_text_for_the_client() -> None:
    ev = [("message_start", {"message": {"id": "m", "type": "message", "role": "assistant", "model": "c", "content": [],
                                         "usage": {"input_tokens": 3, "output_tokens": 1}}}),
          ("content_block_start", {"index": 0, "content_block": {"type": "tool_use", "id": "t",
                                                                 "name": anthropic.JSON_TOOL, "input": {}}}),
          ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '{"answer":'}}),
          ("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta", "partial_json": '"42"}'}}),
          ("content_block_stop", {"index": 0}),
          ("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
          ("message_stop", {})]
    raw = b"".join(b"event: " + n.encode() + b"\ndata: " + body({"type": n, **d}) + b"\n\n" for n, d in ev)
    _, completion = openai_completion(translate("anthropic", "openai", raw))
    choice = completion.choices[0]
    assert orjson.loads(choice.message.content) == {"answer": "42"} and choice.finish_reason == "stop"


def test_parallel_tool_calls_and_top_k_are_carried_or_refused() -> None:
    req = openai.parse_request(body({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": 5,
                                     "parallel_tool_calls": False,
                                     "tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]}))
    an = render("anthropic", req)
    assert an["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True} and an["top_k"] == 5
    with pytest.raises(ClientError, match="parallel_tool_calls"):
        render("gemini", req)
    assert render("gemini", dataclasses.replace(req, parallel_tool_calls=None))["generationConfig"]["topK"] == 5
    with pytest.raises(ClientError, match="top_k") as e:
        render("openai", req)
    assert e.value.status == 400
    back = anthropic.parse_request(body({**orjson.loads(body(an)), "max_tokens": 5}))
    assert back.parallel_tool_calls is False and back.top_k == 5
    assert render("openai", dataclasses.replace(back, top_k=None))["parallel_tool_calls"] is False


# -- JSON Schema for Gemini -----------------------------------------------------------------------

def test_json_schema_refs_and_nullables_are_inlined_for_gemini() -> None:
    schema = {"type": "object", "$defs": {"City": {"type": "object", "properties": {
        "name": {"type": "string"}, "zip": {"type": ["string", "null"]}}, "required": ["name"]}},
        "properties": {"home": {"$ref": "#/$defs/City"}, "trips": {"type": "array", "items": {"$ref": "#/$defs/City"}},
                       "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "free text"},
                       "unit": {"const": "C"}}}
    out = gemini.gemini_schema(schema)
    city = {"type": "object", "properties": {"name": {"type": "string"}, "zip": {"type": "string", "nullable": True}},
            "required": ["name"]}
    assert out == {"type": "object", "properties": {
        "home": city, "trips": {"type": "array", "items": city},
        "note": {"nullable": True, "type": "string", "description": "free text"}, "unit": {"enum": ["C"]}}}
    req = dataclasses.replace(CANONICAL, tools=(ToolDef("f", None, schema),))
    assert render("gemini", req)["tools"][0]["functionDeclarations"][0]["parameters"] == out
    recursive = {"type": "object", "properties": {"node": {"$ref": "#/$defs/N"}},
                 "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}}
    with pytest.raises(ClientError, match="recursive"):
        gemini.gemini_schema(recursive)


# -- malformed tool-call arguments -------------------------------------------------------------

def test_malformed_tool_arguments_are_an_error_not_an_empty_object() -> None:
    bad = dataclasses.replace(CANONICAL, messages=(
        Message("user", (TextPart("x"),)), Message("assistant", (), (ToolCall("c", "f", '{"city": "Par'),)),
        Message("tool", (TextPart("r"),), tool_call_id="c")))
    for upstream in ("anthropic", "gemini"):
        with pytest.raises(ClientError, match="not a JSON object"):
            render(upstream, bad)
    answer = openai.parse_response(body({"choices": [{"message": {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]},
        "finish_reason": "tool_calls"}]}))
    for client in ("anthropic", "gemini"):
        with pytest.raises(UpstreamError):
            PROTOCOLS[client].render_response(answer, model="m")
    events = [StreamStart("s", "m"), ToolCallStart(0, "c", "f"), ToolCallDelta(0, "{not json"),
              StreamFinish("tool_calls"), UsageUpdate(1, 2), StreamEnd()]
    an = anthropic.StreamEncoder(model="m").encode(events)
    # The stream ends in an error event, not a message_stop that would present the call as whole.
    assert an.split(b"\n\n")[-2].startswith(b"event: error") and b"message_stop" not in an
    assert b'"error"' in gemini.StreamEncoder(model="m").encode(events)


# -- tool results with images; is_error --------------------------------------------------------

PNG = "iVBORw0KGgo="


def test_tool_result_images_and_errors_cross_protocols() -> None:
    req = anthropic.parse_request(body({"model": "m", "max_tokens": 5, "messages": [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": [
            {"type": "text", "text": "partial"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]}]}]}))
    assert req.messages[2].content[1] == ImagePart("image/png", PNG)
    result = render("anthropic", req)["messages"][2]["content"][0]
    assert result["is_error"] is True and result["content"][1]["type"] == "image"
    parts = render("gemini", req)["contents"][2]["parts"]
    assert parts == [{"functionResponse": {"name": "shot", "response": {"error": "partial"}}},
                     {"inlineData": {"mimeType": "image/png", "data": PNG}}]
    with pytest.raises(ClientError, match="tool result with images"):
        render("openai", req)
    # is_error comes back from a Gemini client's `error` response.
    gm = gemini.parse_request(body({"contents": [
        {"role": "model", "parts": [{"functionCall": {"name": "shot", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "shot", "response": {"error": "boom"}}}]}]}),
        path_model="m")
    assert gm.messages[1].is_error and render("anthropic", gm)["messages"][1]["content"][0]["is_error"] is True


# -- documents are not images ----------------------------------------------------------------------

PDF = base64.b64encode(b"%PDF-1.4 tiny").decode()


def test_gemini_pdf_is_a_document_everywhere_or_refused() -> None:
    req = gemini.parse_request(body({"contents": [{"parts": [
        {"text": "summarise"}, {"inlineData": {"mimeType": "application/pdf", "data": PDF}}]}]}), path_model="m")
    assert req.messages[0].content[1] == DocumentPart("application/pdf", data=PDF)
    assert render("anthropic", req)["messages"][0]["content"][1] == {
        "type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": PDF}}
    oa = render("openai", req)["messages"][0]["content"][1]
    assert oa == {"type": "file", "file": {"filename": "document.pdf", "file_data": f"data:application/pdf;base64,{PDF}"}}
    assert render("gemini", req)["contents"][0]["parts"][1] == {"inlineData": {"mimeType": "application/pdf", "data": PDF}}
    audio = gemini.parse_request(body({"contents": [{"parts": [
        {"inlineData": {"mimeType": "audio/wav", "data": PDF}}]}]}), path_model="m")
    for upstream in ("anthropic", "openai"):
        with pytest.raises(ClientError, match="audio/wav"):
            render(upstream, audio)
    # And the other direction: OpenAI's and Anthropic's documents parse as documents.
    back = openai.parse_request(body({"model": "m", "messages": [{"role": "user", "content": [oa]}]}))
    assert back.messages[0].content[0] == DocumentPart("application/pdf", data=PDF, name="document.pdf")


# -- refusals ----------------------------------------------------------------------------------

def test_openai_refusal_reaches_an_anthropic_client() -> None:
    resp = openai.parse_response(body({"id": "c", "model": "m", "choices": [{"message": {
        "role": "assistant", "content": None, "refusal": "I can't help with that."}, "finish_reason": "stop"}]}))
    msg = anthropic_sdk.types.Message.model_validate(orjson.loads(anthropic.render_response(resp, model="m")))
    assert msg.stop_reason == "refusal" and msg.content[0].text == "I can't help with that."  # type: ignore[union-attr]
    oa = openai_sdk.types.chat.ChatCompletion.model_validate(orjson.loads(openai.render_response(resp, model="m")))
    assert oa.choices[0].message.refusal == "I can't help with that." and oa.choices[0].message.content is None
    chunks = [{"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": d, "finish_reason": f}]}
              for d, f in (({"role": "assistant", "refusal": "I can't"}, None), ({"refusal": " help."}, None), ({}, "stop"))]
    raw = b"".join(b"data: " + body(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    streamed = anthropic_message(translate("openai", "anthropic", raw))
    assert streamed.stop_reason == "refusal" and streamed.content[0].text == "I can't help."  # type: ignore[union-attr]
    _, completion = openai_completion(translate("openai", "openai", raw))
    assert completion.choices[0].message.refusal == "I can't help."


# -- interleaved parallel tool deltas to an Anthropic client ------------------------------------------

def test_interleaved_parallel_tool_deltas_stay_inside_their_blocks() -> None:
    def chunk(tc: dict) -> dict:
        return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": {"tool_calls": [tc]}, "finish_reason": None}]}
    seq = [chunk({"index": 0, "id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
           chunk({"index": 1, "id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": ""}}),
           chunk({"index": 0, "function": {"arguments": '{"city":'}}), chunk({"index": 1, "function": {"arguments": '{"city":'}}),
           chunk({"index": 1, "function": {"arguments": '"Lima"}'}}), chunk({"index": 0, "function": {"arguments": '"Paris"}'}})]
    raw = b"".join(b"data: " + body(c) + b"\n\n" for c in seq)
    raw += b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\ndata: [DONE]\n\n'
    out = translate("openai", "anthropic", raw)
    msg = anthropic_message(out)
    assert [(b.id, b.input) for b in msg.content] == [("call_a", {"city": "Paris"}), ("call_b", {"city": "Lima"})]  # type: ignore[union-attr]
    # On the wire: no delta after its block's stop.
    stopped: set[int] = set()
    for line in out.split(b"\n"):
        if line.startswith(b"data: "):
            ev = orjson.loads(line[6:])
            if ev["type"] == "content_block_stop":
                stopped.add(ev["index"])
            elif ev["type"] == "content_block_delta":
                assert ev["index"] not in stopped


# -- Anthropic cache tokens in message_delta ----------------------------------------------------------

def test_message_delta_cache_tokens_count_without_input_tokens() -> None:
    ev = [("message_start", {"message": {"id": "m", "type": "message", "role": "assistant", "model": "c", "content": [],
                                         "usage": {"input_tokens": 10, "cache_read_input_tokens": 0,
                                                   "output_tokens": 1}}}),
          ("message_delta", {"delta": {"stop_reason": "end_turn"},
                             "usage": {"cache_read_input_tokens": 500, "output_tokens": 7}}),
          ("message_stop", {})]
    raw = b"".join(b"event: " + n.encode() + b"\ndata: " + body({"type": n, **d}) + b"\n\n" for n, d in ev)
    tr = translate_stream("anthropic", "openai", STREAM_REQ)
    tr.feed(raw)
    tr.finish()
    assert (tr.meter.reported.input_tokens, tr.meter.reported.output_tokens) == (510, 7)


# -- snake_case generation_config ------------------------------------------------------------

def test_gemini_snake_case_generation_config_is_read() -> None:
    req = gemini.parse_request(body({"contents": [{"parts": [{"text": "x"}]}], "generation_config": {
        "max_output_tokens": 64, "top_p": 0.5, "top_k": 3, "stop_sequences": ["Z"], "temperature": 0.2,
        "response_mime_type": "application/json"}}), path_model="m")
    assert (req.max_tokens, req.top_p, req.top_k, req.stop, req.temperature) == (64, 0.5, 3, ("Z",), 0.2)
    assert req.response_format == ResponseFormat("json_object")


# -- Gemini 3 streamed function-call arguments (partialArgs) -----------------------------------------

def test_gemini_streamed_partial_arguments_are_assembled() -> None:
    sse = sse_from_chunks("gemini", RECORDED["vai-google-stream-no-args-tool-call.chunks.txt"])
    msg = anthropic_message(translate("gemini", "anthropic", sse))
    assert msg.content[0].type == "thinking"  # the recorded thought summary (issue 37)
    assert [(b.name, b.input) for b in msg.content[1:]] == [  # type: ignore[union-attr]
        ("read_theme", {}), ("read_screen", {"id": "A"}), ("read_screen", {"id": "B"}), ("read_screen", {"id": "C"})]
    assert msg.stop_reason == "tool_use" and msg.usage.input_tokens == 249


def test_thought_signature_round_trips_through_openai_and_anthropic_clients() -> None:
    resp = gemini.parse_response(body(SIGNED))
    # OpenAI client: the signature rides in the call id it hands back with the next turn.
    oa = orjson.loads(openai.render_response(resp, model="m"))["choices"][0]["message"]
    history = {"model": "m", "messages": [
        {"role": "user", "content": "weather?"}, oa,
        *({"role": "tool", "tool_call_id": tc["id"], "content": "sunny"} for tc in oa["tool_calls"])]}
    req = openai.parse_request(body(history))
    parts = render("gemini", req)["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in parts] == ["c2lnLTE=", None]
    # An OpenAI or Anthropic upstream never sees the carried signature.
    sent = render("openai", req)["messages"]
    assert [tc["id"] for tc in sent[1]["tool_calls"]] == [sent[2]["tool_call_id"], sent[3]["tool_call_id"]]
    assert all("__ts_" not in tc["id"] and len(tc["id"]) <= 40 for tc in sent[1]["tool_calls"])
    assert all("__ts_" not in b["id"] for b in render("anthropic", req)["messages"][1]["content"])
    # Anthropic client, streamed: the same, inside the id pattern Anthropic allows.
    raw = b"data: " + body(SIGNED) + b"\r\n\r\n"
    msg = anthropic_message(translate("gemini", "anthropic", raw))
    assert all(anthropic._TOOL_ID.match(b.id) for b in msg.content)  # type: ignore[union-attr]
    replay = {"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"}) for b in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": "sunny"}
                                     for b in msg.content]}]}  # type: ignore[union-attr]
    parts = render("gemini", anthropic.parse_request(body(replay)))["contents"][1]["parts"]
    assert [p.get("thoughtSignature") for p in parts] == ["c2lnLTE=", None]
