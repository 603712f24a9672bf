"""Conformance: recorded provider traffic and the providers' documented request examples through
every client/upstream pair, each checked for meaning (ids, arguments, text, usage, finish
reasons). Upstream bytes are read by reference readers (the official SDKs where one exists,
`readers.py`) and the client's bytes by the client's own SDK parsers, never by the adapters
under test. Sources of every file: data/SOURCES.md."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass

import orjson
import pytest

from adapters import anthropic, gemini
from adapters.call_ids import split_signature
from adapters.injected_usage import InjectedUsageFilter, is_usage_chunk
from adapters.internal import ChatRequest, Message, TextPart
from adapters.registry import PROTOCOLS, translate_stream
from contracts.errors import ClientError
from tests.adapters.conformance.readers import RESPONSE_READERS, STREAM_READERS, UPSTREAM_STREAM_READERS, Meaning
from tests.adapters.conformance.recorded import DATA, RECORDED, sse_from_chunks

CLIENTS = ("openai", "anthropic", "gemini")
# The internal finish reason in each protocol's own words (Gemini ends tool turns with STOP).
FINISH = {
    "openai": {"stop": "stop", "length": "length", "tool_calls": "tool_calls", "content_filter": "content_filter"},
    "anthropic": {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "refusal"},
    "gemini": {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP", "content_filter": "SAFETY"},
}
GEMINI_ID = re.compile(r"^call_[0-9a-f]{16}_\d+")
REQ = ChatRequest("client-model", (Message("user", (TextPart("hi"),)),), stream=True, include_usage=True)


@dataclass(frozen=True)
class Expect:
    """What a recorded exchange means, read off the recording by hand."""

    text: str  # how the visible answer starts ("" for none)
    calls: tuple[tuple[str, dict], ...]
    finish: str  # internal vocabulary
    usage: tuple[int, int] | None  # (input incl. cached, output incl. thinking); None: not reported


def _upstream_bytes(name: str, upstream: str) -> bytes:
    raw = RECORDED[name]
    return raw if name.endswith(".sse") else sse_from_chunks(upstream, raw)


def _check_reference(ref: Meaning, upstream: str, exp: Expect) -> None:
    """The reference reading of the recording agrees with the table (so the table is the recording's)."""
    assert ref.text.startswith(exp.text)
    assert [(n, a) for _, n, a in ref.calls] == list(exp.calls)
    assert ref.finish == FINISH[upstream][exp.finish]
    assert ref.usage == exp.usage


def _check_client(got: Meaning, ref: Meaning, upstream: str, client: str, exp: Expect) -> None:
    assert got.text == ref.text
    assert [(n, a) for _, n, a in got.calls] == list(exp.calls)
    assert got.finish == FINISH[client][exp.finish]
    assert got.usage == (exp.usage or (0, 0))
    if client == "gemini":
        return  # Gemini calls carry no ids
    ids = [i for i, _, _ in got.calls]
    assert len(set(ids)) == len(ids)
    if upstream == "gemini":
        # Synthesized, unique per response, and carrying the call's thought signature back to us.
        assert [split_signature(i)[0] for i in ids] == [m[0] for m in map(GEMINI_ID.findall, ids)]
        assert [split_signature(i)[1] or "" for i in ids] == [sig for sig, _, _ in ref.calls]
    elif client == "anthropic":
        assert ids == [anthropic.tool_id(i) for i, _, _ in ref.calls]
    else:
        assert ids == [i for i, _, _ in ref.calls]


# ---- streams -------------------------------------------------------------------------------

STREAMS: dict[str, tuple[str, Expect]] = {
    "aig-cassette-chat-streaming.sse": ("openai", Expect("Hi there! How can I help today", (), "stop", None)),
    "aig-cassette-chat-streaming-detailed-usage.sse": ("openai", Expect("", (), "length", (12, 100))),
    "vai-openai-text.chunks.txt": ("openai", Expect("**Holiday Name:** Harmony Day", (), "stop", (16, 300))),
    "vai-openai-compatible-anthropic-fallback-tool-call.sse": (
        "openai", Expect("Reading it.", (("read_file", {"path": "a.txt"}),), "tool_calls", None)),
    "vai-anthropic-text.chunks.txt": ("anthropic", Expect("Hello! I'm doing well", (), "stop", (12, 30))),
    "vai-anthropic-clear-thinking.1.chunks.txt": ("anthropic", Expect("925 ÷ 5 = 185", (), "stop", (69, 53))),
    "vai-anthropic-json-tool.1.chunks.txt": ("anthropic", Expect("", (("json", {"elements": [
        {"location": "San Francisco", "temperature": 58, "condition": "sunny"}]}),), "tool_calls", (849, 47))),
    "vai-anthropic-message-delta-input-tokens.chunks.txt": ("anthropic", Expect("pong", (), "stop", (61, 2))),
    "vai-anthropic-refusal.chunks.txt": ("anthropic", Expect("", (), "content_filter", (18, 5))),
    "vai-anthropic-tool-no-args.chunks.txt": (
        "anthropic", Expect("I'll update the issue list", (("updateIssueList", {}),), "tool_calls", (565, 48))),
    "vai-google-text.chunks.txt": ("gemini", Expect('There are **3** "r"s in strawberry.', (), "stop", (9, 208))),
    "vai-google-reasoning-gemini3.chunks.txt": ("gemini", Expect('There are **3** "r"s', (), "stop", (9, 325))),
    "vai-google-tool-call.chunks.txt": (
        "gemini", Expect("", (("weather", {"location": "San Francisco"}),), "tool_calls", (29, 60))),
    "vai-google-issue-18073-empty-text-thought-signature.chunks.txt": ("gemini", Expect("4", (), "stop", (15, 53))),
    "vai-google-stream-no-args-tool-call.chunks.txt": ("gemini", Expect("", (
        ("read_theme", {}), ("read_screen", {"id": "A"}), ("read_screen", {"id": "B"}), ("read_screen", {"id": "C"})),
        "tool_calls", (249, 241))),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_recorded_stream(name: str, client: str) -> None:
    upstream, exp = STREAMS[name]
    raw = _upstream_bytes(name, upstream)
    ref = UPSTREAM_STREAM_READERS[upstream](raw)
    _check_reference(ref, upstream, exp)
    tr = translate_stream(upstream, client, REQ)
    out = b"".join(tr.feed(raw[i:i + 7]) for i in range(0, len(raw), 7)) + tr.finish()
    assert tr.finished and tr.error is None
    usage = exp.usage or (0, 0)
    assert (tr.meter.reported.input_tokens, tr.meter.reported.output_tokens) == usage
    _check_client(STREAM_READERS[client](out), ref, upstream, client, exp)


@pytest.mark.parametrize("name", sorted(n for n, (p, _) in STREAMS.items() if p == "openai"))
def test_recorded_openai_stream_passthrough_with_injected_usage(name: str) -> None:
    raw = _upstream_bytes(name, "openai")
    f = InjectedUsageFilter()
    out = b"".join(f.feed(raw[i:i + 11]) for i in range(0, len(raw), 11)) + f.finish()
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]
    assert out.strip() == b"".join(e for e in events if not is_usage_chunk(e)).strip()
    ref, got = UPSTREAM_STREAM_READERS["openai"](raw), UPSTREAM_STREAM_READERS["openai"](out)
    assert (got.text, got.calls, got.finish, got.usage) == (ref.text, ref.calls, ref.finish, None)
    assert f.finished and (f.meter.reported.input_tokens, f.meter.reported.output_tokens) == (STREAMS[name][1].usage
                                                                                             or (0, 0))


# ---- whole responses -------------------------------------------------------------------------

RESPONSES: dict[str, tuple[str, Expect]] = {
    "vai-openai-text.json": ("openai", Expect("**Holiday Name:** Galaxy Day", (), "stop", (16, 363))),
    "vai-anthropic-refusal.json": ("anthropic", Expect("", (), "content_filter", (18, 5))),
    "vai-anthropic-tool-no-args.json": (
        "anthropic", Expect("<thinking>\nThe updateIssueList", (("updateIssueList", {}),), "tool_calls", (602, 93))),
    "vai-anthropic-issue-11719-quoted-tool-input.json": ("anthropic", Expect("", (("website_update", {
        "website_path": "/home/user/pace-landing", "tasks": [{"description": "Today you post every run to Strava, but "
                                                              "Strava does not answer the question: \"What should I do "
                                                              "next after this run?\". It is a great log, but it is not "
                                                              "adaptive.", "type": "feature", "passes": False}]}),),
        "tool_calls", (912, 118))),
    "vai-google-issue-19758-prompt-block.json": ("gemini", Expect("", (), "content_filter", (9, 0))),
    "vai-google-text.json": ("gemini", Expect("There are **3** r's in strawberry.", (), "stop", (9, 272))),
    "vai-google-tool-call.json": (
        "gemini", Expect("", (("weather", {"location": "San Francisco"}),), "tool_calls", (29, 908))),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", sorted(RESPONSES))
def test_recorded_response(name: str, client: str) -> None:
    upstream, exp = RESPONSES[name]
    ref = RESPONSE_READERS[upstream](RECORDED[name])
    _check_reference(ref, upstream, exp)
    resp = PROTOCOLS[upstream].parse_response(RECORDED[name])
    out = PROTOCOLS[client].render_response(resp, model="client-model")
    _check_client(RESPONSE_READERS[client](out), ref, upstream, client, exp)
    if upstream == client == "gemini" and b"candidates" in RECORDED[name]:  # thought signatures round-trip
        sent = [p.get("thoughtSignature") for p in orjson.loads(RECORDED[name])["candidates"][0]["content"]["parts"]
                if "functionCall" in p]
        back = [p.get("thoughtSignature") for p in orjson.loads(out)["candidates"][0]["content"]["parts"]
                if "functionCall" in p]
        assert back == sent


# ---- requests (the providers' documented examples) ---------------------------------------------

REQUESTS_DIR = DATA / "requests"
Check = Callable[[dict], object]


def _tool_results(body: dict, upstream: str) -> list[str]:
    if upstream == "openai":
        return [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if upstream == "anthropic":
        return [b["content"] if type(b["content"]) is str else b["content"][0]["text"]
                for m in body["messages"] if type(m["content"]) is list for b in m["content"] if b["type"] == "tool_result"]
    return [str(p["functionResponse"]["response"]) for c in body["contents"] for p in c["parts"] if "functionResponse" in p]


# (file, upstream) -> an error the target must answer with (400), or checks on the upstream body.
REQUEST_CASES: dict[str, dict[str, str | list[Check]]] = {
    "openai-default.json": {
        "anthropic": [lambda b: b["system"] == "You are a helpful assistant.", lambda b: b["max_tokens"] == 4096],
        "gemini": [lambda b: b["systemInstruction"]["parts"][0]["text"] == "You are a helpful assistant."],
        "openai": [lambda b: b["messages"][0] == {"role": "system", "content": "You are a helpful assistant."}]},
    "openai-image-input.json": {
        "anthropic": [lambda b: b["messages"][0]["content"][1]["source"]["type"] == "url", lambda b: b["max_tokens"] == 300],
        "gemini": [lambda b: b["contents"][0]["parts"][1]["fileData"]["mimeType"] == "image/jpeg",
                   lambda b: b["generationConfig"]["maxOutputTokens"] == 300],
        "openai": [lambda b: b["max_completion_tokens"] == 300 and "max_tokens" not in b]},
    "openai-functions.json": {
        "anthropic": [lambda b: b["tools"][0]["input_schema"]["properties"]["unit"]["enum"] == ["celsius", "fahrenheit"],
                      lambda b: b["tool_choice"] == {"type": "auto"}],
        "gemini": [lambda b: b["tools"][0]["functionDeclarations"][0]["name"] == "get_current_weather",
                   lambda b: b["toolConfig"]["functionCallingConfig"]["mode"] == "AUTO"],
        "openai": [lambda b: b["tool_choice"] == "auto"]},
    "openai-tool-result-turn.json": {
        "anthropic": [lambda b: b["messages"][1]["content"][0]["input"] == {"location": "Paris, France"},
                      lambda b: b["messages"][2]["content"][0]["tool_use_id"] == "call_12345xyz"],
        "gemini": [lambda b: b["contents"][1]["parts"][0]["functionCall"]["args"] == {"location": "Paris, France"},
                   lambda b: b["contents"][2]["parts"][0]["functionResponse"] == {"name": "get_weather",
                                                                                  "response": {"content": "14"}}],
        "openai": [lambda b: b["messages"][1]["tool_calls"][0]["id"] == "call_12345xyz"]},
    "openai-structured-output.json": {
        "anthropic": [lambda b: b["tool_choice"] == {"type": "tool", "name": anthropic.JSON_TOOL}],
        "gemini": [lambda b: b["generationConfig"]["responseSchema"]["properties"]["steps"]["items"]["required"]
                   == ["explanation", "output"]],
        "openai": [lambda b: b["response_format"]["json_schema"]["strict"] is True]},
    "openai-pdf-file.json": {
        "anthropic": [lambda b: b["messages"][0]["content"][0]["type"] == "document"],
        "gemini": [lambda b: b["contents"][0]["parts"][0]["inlineData"]["mimeType"] == "application/pdf"],
        "openai": [lambda b: b["messages"][0]["content"][0]["file"]["filename"] == "draconomicon.pdf"]},
    "openai-parallel-off-kimi-ids.json": {
        "anthropic": [lambda b: b["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True},
                      lambda b: re.fullmatch(r"[A-Za-z0-9_-]+", b["messages"][1]["content"][0]["id"])],
        "gemini": "parallel_tool_calls",
        "openai": [lambda b: b["parallel_tool_calls"] is False and b["max_completion_tokens"] == 512]},
    "anthropic-basic.json": {
        "anthropic": [lambda b: b["max_tokens"] == 1024], "gemini": [lambda b: b["generationConfig"]["maxOutputTokens"] == 1024],
        "openai": [lambda b: b["max_completion_tokens"] == 1024]},
    "anthropic-tool-use.json": {
        "anthropic": [lambda b: b["messages"][1]["content"][1]["id"] == "toolu_01A09q90qw90lq917835lq9"],
        "gemini": [lambda b: b["contents"][1]["parts"][1]["thoughtSignature"] == gemini.SKIP_SIGNATURE],
        "openai": [lambda b: b["messages"][1]["content"] == "I'll check the current weather in San Francisco for you."]},
    "anthropic-image-base64.json": {
        "anthropic": [lambda b: b["messages"][0]["content"][0]["source"]["media_type"] == "image/png"],
        "gemini": [lambda b: b["contents"][0]["parts"][0]["inlineData"]["mimeType"] == "image/png"],
        "openai": [lambda b: b["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")]},
    "anthropic-pdf-document.json": {
        "anthropic": [lambda b: b["messages"][0]["content"][0]["source"]["media_type"] == "application/pdf"],
        "gemini": [lambda b: b["contents"][0]["parts"][0]["inlineData"]["mimeType"] == "application/pdf"],
        "openai": [lambda b: b["messages"][0]["content"][0]["type"] == "file"]},
    "anthropic-tool-choice-any-no-parallel.json": {
        "anthropic": [lambda b: b["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True},
                      lambda b: b["top_k"] == 40],
        "gemini": "parallel_tool_calls", "openai": "top_k"},
    "anthropic-tool-result-image-error.json": {
        "anthropic": [lambda b: b["messages"][2]["content"][0]["is_error"] is True,
                      lambda b: b["messages"][2]["content"][0]["content"][1]["type"] == "image"],
        "gemini": [lambda b: b["contents"][2]["parts"][0]["functionResponse"]["response"] == {"error": "page half loaded"},
                   lambda b: b["contents"][2]["parts"][1]["inlineData"]["mimeType"] == "image/png"],
        "openai": "tool result with images"},
    "gemini-text.json": {
        "anthropic": [lambda b: b["messages"] == [{"role": "user", "content": "Explain how AI works in a few words"}]],
        "gemini": [lambda b: b["contents"][0]["parts"] == [{"text": "Explain how AI works in a few words"}]],
        "openai": [lambda b: b["messages"][0]["content"] == "Explain how AI works in a few words"]},
    "gemini-config.json": {
        "anthropic": [lambda b: (b["top_k"], b["top_p"], b["stop_sequences"], b["max_tokens"]) == (10, 0.8, ["Title"], 800)],
        "gemini": [lambda b: b["generationConfig"]["topK"] == 10], "openai": "top_k"},
    "gemini-function-calling.json": {
        "anthropic": [lambda b: b["tools"][0]["input_schema"]["required"] == ["brightness", "color_temp"]],
        "gemini": [lambda b: b["tools"][0]["functionDeclarations"][0]["parameters"]["properties"]["brightness"]["type"]
                   == "integer"],
        "openai": [lambda b: b["tools"][0]["function"]["parameters"]["properties"]["color_temp"]["enum"]
                   == ["daylight", "cool", "warm"]]},
    "gemini-structured-output.json": {
        "anthropic": "schema of type object",
        "gemini": [lambda b: b["generationConfig"]["responseSchema"]["items"]["properties"]["note"]
                   == {"type": "string", "nullable": True}],
        "openai": [lambda b: b["response_format"]["json_schema"]["schema"]["items"]["properties"]["note"]
                   == {"type": ["string", "null"]}]},
    "gemini-inline-pdf-snake.json": {
        "anthropic": [lambda b: b["messages"][0]["content"][0]["type"] == "document", lambda b: b["max_tokens"] == 256],
        "gemini": [lambda b: b["generationConfig"] == {"temperature": 0.2, "maxOutputTokens": 256}],
        "openai": [lambda b: b["messages"][0]["content"][0]["file"]["file_data"].startswith("data:application/pdf")]},
    "gemini-thought-signature-turn.json": {
        "anthropic": [lambda b: b["messages"][1]["content"][0]["id"] == b["messages"][2]["content"][0]["tool_use_id"]],
        "gemini": [lambda b: b["contents"][1]["parts"][0]["thoughtSignature"].startswith("EqUCCqICAb4+9vsh")],
        "openai": [lambda b: b["messages"][2]["content"] == "18C and foggy"]},
    "gemini-parallel-calls.json": {
        "anthropic": [lambda b: [x["tool_use_id"] for x in b["messages"][2]["content"]]
                      == [x["id"] for x in b["messages"][1]["content"]]],
        "gemini": [lambda b: [p.get("thoughtSignature", "")[:8] for p in b["contents"][1]["parts"]] == ["AY89a19Y", ""]],
        "openai": [lambda b: [m["content"] for m in b["messages"][2:]] == ["Paris: 14C", "Tokyo: 22C"]]},
}
REQUEST_PARAMS = [(f, u) for f in sorted(REQUEST_CASES) for u in CLIENTS]


def _parse(client: str, raw: bytes) -> ChatRequest:
    return PROTOCOLS[client].parse_request(raw, path_model="documented-model" if client == "gemini" else None)


def _meaning(req: ChatRequest) -> tuple:
    """What must survive any target: turns' roles and text, calls (name, args), results' text."""
    turns = []
    for m in req.messages:
        kinds = tuple(type(p).__name__ for p in m.content if not (type(p) is TextPart and not p.text))
        turns.append((m.role, "".join(p.text for p in m.content if type(p) is TextPart), kinds,
                      tuple((tc.name, orjson.loads(tc.arguments or "{}")) for tc in m.tool_calls)))
    return (req.system or None, tuple(turns), req.max_tokens, req.temperature, req.top_p, req.stop,
            tuple(t.name for t in req.tools), req.response_format.type if req.response_format else None)


@pytest.mark.parametrize(("name", "upstream"), REQUEST_PARAMS)
def test_documented_request(name: str, upstream: str) -> None:
    client = name.split("-", 1)[0]
    req = _parse(client, (REQUESTS_DIR / name).read_bytes())
    expect = REQUEST_CASES[name][upstream]
    render = PROTOCOLS[upstream].render_request
    if isinstance(expect, str):
        with pytest.raises(ClientError, match=expect) as e:
            render(req, upstream_model="up", credential=None)
        assert e.value.status == 400
        return
    up = render(req, upstream_model="up", credential=None)
    body = orjson.loads(up.body)
    for check in expect:
        assert check(body), name
    back = _parse(upstream, up.body)
    # Tool results still answer the call before them, under the ids the target uses.
    calls = {tc.id: tc.name for m in back.messages for tc in m.tool_calls}
    for m in back.messages:
        if m.role == "tool" and upstream != "gemini":
            assert m.tool_call_id in calls
    if upstream == "anthropic":
        for tid in calls:
            assert anthropic._TOOL_ID.match(tid)
    if upstream == "anthropic" and req.max_tokens is None:  # Anthropic requires a cap: ours is the default
        assert back.max_tokens == anthropic.DEFAULT_MAX_TOKENS
        back = dataclasses.replace(back, max_tokens=None)
    assert _meaning(back) == _meaning(req)
