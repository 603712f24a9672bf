"""Request translation: every client protocol x every upstream protocol, through the internal format."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from adapters import anthropic, gemini, openai
from adapters.internal import ChatRequest, Message, TextPart, ToolChoice, estimate_prompt_tokens
from adapters.registry import PROTOCOLS
from contracts.errors import ClientError
from tests.adapters.fixtures import CANONICAL, PNG, REQUESTS, SCHEMA, body
from tests.adapters.translation_checks import NAMES, canon, parse


@pytest.mark.parametrize("proto", NAMES)
def test_each_protocol_parses_to_the_canonical_request(proto: str) -> None:
    assert canon(parse(proto, body(REQUESTS[proto]))) == CANONICAL


RENDERED = {
    "openai": ("/v1/chat/completions", {"content-type": "application/json", "authorization": "Bearer sk-1"}),
    "anthropic": ("/v1/messages", {"content-type": "application/json", "anthropic-version": "2023-06-01",
                                   "x-api-key": "sk-1"}),
    "gemini": ("/v1beta/models/up-model:generateContent", {"content-type": "application/json",
                                                            "x-goog-api-key": "sk-1"}),
}


@pytest.mark.parametrize("upstream", NAMES)
def test_render_request_path_headers_and_golden_body(upstream: str) -> None:
    up = PROTOCOLS[upstream].render_request(CANONICAL, upstream_model="up-model", credential="sk-1")
    assert (up.path, up.headers) == RENDERED[upstream]
    expected = dict(REQUESTS[upstream])
    got = orjson.loads(up.body)
    if upstream == "openai":
        expected["model"] = "up-model"
        expected["messages"][2]["content"] = None
        # OpenAI's reasoning models refuse max_tokens; max_completion_tokens is the documented field.
        expected["max_completion_tokens"] = expected.pop("max_tokens")
        assert got == expected
    elif upstream == "anthropic":
        expected["model"] = "up-model"
        assert got == expected
    else:
        # The plain-text tool result travels wrapped; the schema survives Gemini's key filter; the
        # replayed call (it came without a thought signature) carries Google's stand-in.
        expected["contents"] = [dict(c) for c in expected["contents"]]
        expected["contents"][1] = {"role": "model", "parts": [{**expected["contents"][1]["parts"][0],
                                                               "thoughtSignature": gemini.SKIP_SIGNATURE}]}
        assert got == expected


def test_render_without_credential_sends_no_auth_header() -> None:
    for name in NAMES:
        h = PROTOCOLS[name].render_request(CANONICAL, upstream_model="m", credential=None).headers
        assert set(h) <= {"content-type", "anthropic-version"}


def test_streaming_paths_and_flags() -> None:
    req = dataclasses.replace(CANONICAL, stream=True)
    assert gemini.render_request(req, upstream_model="g-1", credential=None).path == \
        "/v1beta/models/g-1:streamGenerateContent?alt=sse"
    oa = orjson.loads(openai.render_request(req, upstream_model="m", credential=None).body)
    assert oa["stream"] is True and oa["stream_options"] == {"include_usage": True}
    assert orjson.loads(anthropic.render_request(req, upstream_model="m", credential=None).body)["stream"] is True


def test_openai_n_asks_for_several_choices_only_a_same_protocol_upstream_gives() -> None:
    ask = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    three = openai.parse_request(orjson.dumps({**ask, "n": 3}))
    assert (three.choices, three.native_only) == (3, "n > 1")
    one = openai.parse_request(orjson.dumps({**ask, "n": 1}))
    assert (one.choices, one.native_only) == (1, None)


def test_gemini_candidates_and_own_tools_are_for_a_gemini_deployment_only() -> None:
    ask = {"contents": [{"parts": [{"text": "x"}]}]}
    got = gemini.parse_request(orjson.dumps({**ask, "generationConfig": {"candidateCount": 3},
                                             "tools": [{"googleSearch": {}}, {"code_execution": {}}]}), path_model="m")
    assert got.choices == 3 and got.tools == ()
    assert got.native_only == "tools[0].googleSearch, tools[1].code_execution, generationConfig.candidateCount > 1"
    plain = gemini.parse_request(orjson.dumps(ask), path_model="m")
    assert (plain.choices, plain.native_only) == (1, None)


def test_openai_details() -> None:
    r = openai.parse_request(body({
        "model": "m", "messages": [{"role": "developer", "content": "a"}, {"role": "system", "content": [
            {"type": "text", "text": "b"}]}, {"role": "user", "content": "hi"}],
        "stop": "X", "max_completion_tokens": 7, "stream": True, "stream_options": {"include_usage": True},
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }))
    assert r.system == "a\n\nb" and r.stop == ("X",) and r.max_tokens == 7 and r.stream and r.include_usage
    assert r.tool_choice == ToolChoice("tool", "f")
    url = openai.parse_request(body({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}]}]}))
    assert url.messages[0].content[0].url == "https://x/y.jpg"


def test_anthropic_details() -> None:
    # Temperature above Anthropic's 0..1 is clamped; max_tokens gets a default.
    req = dataclasses.replace(CANONICAL, temperature=1.7, max_tokens=None,
                              tool_choice=ToolChoice("tool", "get_weather"))
    b = orjson.loads(anthropic.render_request(req, upstream_model="m", credential=None).body)
    assert b["temperature"] == 1.0 and b["max_tokens"] == anthropic.DEFAULT_MAX_TOKENS
    assert b["tool_choice"] == {"type": "tool", "name": "get_weather"}
    r = anthropic.parse_request(body({"model": "m", "max_tokens": 5, "system": [{"type": "text", "text": "s"}],
                                      "messages": [{"role": "user", "content": "hi"}],
                                      "tool_choice": {"type": "any"}}))
    assert r.system == "s" and r.tool_choice == ToolChoice("required")


def test_gemini_details() -> None:
    req = dataclasses.replace(CANONICAL, tool_choice=ToolChoice("tool", "get_weather"), tools=(
        dataclasses.replace(CANONICAL.tools[0], parameters={**SCHEMA, "additionalProperties": False,
                                                            "$schema": "x"}),))
    b = orjson.loads(gemini.render_request(req, upstream_model="m", credential=None).body)
    assert b["tools"][0]["functionDeclarations"][0]["parameters"] == SCHEMA
    assert b["toolConfig"] == {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}}
    # Two calls to the same function get distinct synthesized ids, paired in order with their responses.
    r = gemini.parse_request(body({"contents": [
        {"role": "user", "parts": [{"text": "q"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {"a": 1}}},
                                    {"functionCall": {"name": "f", "args": {"a": 2}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"r": 1}}},
                                   {"functionResponse": {"name": "f", "response": {"r": 2}}}]},
    ]}), path_model="models/g")
    assert r.model == "g"
    assert [tc.id for tc in r.messages[1].tool_calls] == ["call_0", "call_1"]
    assert [(m.tool_call_id, m.content[0].text) for m in r.messages[2:]] == [("call_0", '{"r":1}'), ("call_1", '{"r":2}')]
    # ...and rendered back, both responses share one user turn.
    out = orjson.loads(gemini.render_request(r, upstream_model="g", credential=None).body)
    assert [len(c["parts"]) for c in out["contents"]] == [1, 2, 2]
    img = gemini.render_request(ChatRequest("m", (Message("user", (TextPart("x"),)),)), upstream_model="g",
                                credential=None)
    assert orjson.loads(img.body) == {"contents": [{"role": "user", "parts": [{"text": "x"}]}]}


BAD = {
    "openai": [
        b"", b"not json", b"[]", b'{"messages":[{"role":"user","content":"x"}]}',
        b'{"model":"m","messages":[]}', b'{"model":"m","messages":[{"role":"wizard","content":"x"}]}',
        b'{"model":"m","messages":[{"role":"user","content":5}]}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":"hot"}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":3}',
        b'{"model":"m","messages":[{"role":"tool","content":"x"}]}',
        b'{"model":"m","messages":[{"role":"system","content":"x"}]}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"n":0}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"n":129}',
        b'{"model":"m","messages":[{"role":"user","content":"x"}],"stop":[1]}',
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio"}]}]}',
    ],
    "anthropic": [
        b"{", b'{"model":"m","messages":[{"role":"user","content":"x"}]}',
        b'{"model":"m","max_tokens":1,"messages":[]}',
        b'{"model":"m","max_tokens":1,"messages":[{"role":"system","content":"x"}]}',
        b'{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"x"}]}',
        b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"document"}]}]}',
        b'{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"tools":[{"type":5,"name":"w"}]}',
    ],
    "gemini": [
        b"null", b'{"contents":[]}', b'{"contents":[{"role":"bot","parts":[{"text":"x"}]}]}',
        b'{"contents":[{"parts":[]}]}', b'{"contents":[{"parts":[{"executableCode":{}}]}]}',
        b'{"contents":[{"parts":[{"text":"x"}]}],"generationConfig":{"candidateCount":9}}',
        b'{"contents":[{"parts":[{"text":"x"}]}],"tools":[{}]}',
    ],
}

# What is wrong with each BAD body, in order.
BAD_NAMES = {
    "openai": ["empty", "not-json", "array", "no-model", "no-messages", "unknown-role", "content-number",
               "temperature-string", "temperature-3", "tool-without-call-id", "system-only", "n-0", "n-129", "stop-number",
               "input-audio"],
    "anthropic": ["truncated", "no-max_tokens", "no-messages", "system-role", "max_tokens-0", "document-no-source",
                  "tool-type-number"],
    "gemini": ["null", "no-contents", "unknown-role", "no-parts", "executable-code", "candidateCount-9",
               "empty-tool"],
}
assert {p: len(n) for p, n in BAD_NAMES.items()} == {p: len(r) for p, r in BAD.items()}


@pytest.mark.parametrize(("proto", "raw"), [(p, r) for p, rs in BAD.items() for r in rs],
                         ids=[f"{p}-{name}" for p, names in BAD_NAMES.items() for name in names])
def test_bad_requests_are_400(proto: str, raw: bytes) -> None:
    with pytest.raises(ClientError) as ei:
        PROTOCOLS[proto].parse_request(raw, path_model="m" if proto == "gemini" else None)
    assert ei.value.status == 400 and ei.value.message


def test_gemini_requires_a_model_in_the_path() -> None:
    with pytest.raises(ClientError):
        gemini.parse_request(b'{"contents":[{"parts":[{"text":"x"}]}]}')


def test_estimate_prompt_tokens_grows_with_input() -> None:
    small = estimate_prompt_tokens(ChatRequest("m", (Message("user", (TextPart("x" * 40),)),)))
    big = estimate_prompt_tokens(ChatRequest("m", (Message("user", (TextPart("x" * 4000),)),)))
    assert 10 <= small < big and big >= 1000
    assert estimate_prompt_tokens(CANONICAL) > 0
    assert PNG


@pytest.mark.parametrize("name", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("stream", [False, True])
def test_request_target_is_render_requests_path_and_headers(name: str, stream: bool) -> None:
    mod = PROTOCOLS[name]
    req = ChatRequest(model="m", messages=(Message("user", (TextPart("hi"),)),), stream=stream)
    full = mod.render_request(req, upstream_model="up-model", credential="secret")
    assert mod.request_target(req, upstream_model="up-model", credential="secret") == (full.path, full.headers)
