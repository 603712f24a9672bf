"""Hypothesis fuzzing: every parser either succeeds or raises ModelyardError, never anything else."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.internal import StreamEnd, StreamError
from adapters.registry import PROTOCOLS, translate_stream
from adapters.sse import SSEFramer
from contracts.errors import ModelyardError
from tests.adapters.fixtures import CANONICAL, REQUESTS, RESPONSES, STREAMS
from tests.adapters.mutation import mutate

NAMES = ["openai", "anthropic", "gemini"]
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Keys the parsers look at, so random objects reach deep code paths.
KEYS = sorted({
    "model", "messages", "role", "content", "type", "text", "image_url", "url", "tool_calls", "id", "function",
    "name", "arguments", "tool_call_id", "tools", "parameters", "tool_choice", "stop", "stream", "temperature",
    "top_p", "max_tokens", "n", "stream_options", "include_usage", "system", "source", "data", "media_type",
    "input", "tool_use_id", "is_error", "input_schema", "stop_sequences", "contents", "parts", "functionCall",
    "functionResponse", "args", "response", "inlineData", "fileData", "mimeType", "fileUri", "systemInstruction",
    "generationConfig", "toolConfig", "functionCallingConfig", "mode", "functionDeclarations", "choices",
    "message", "finish_reason", "usage", "prompt_tokens", "candidates", "finishReason", "usageMetadata",
    "stop_reason", "delta", "index", "content_block", "partial_json", "error", "promptFeedback", "blockReason",
    "thought", "maxOutputTokens", "candidateCount", "allowedFunctionNames",
})
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.floats(allow_nan=False, width=32),
                    st.sampled_from(["user", "assistant", "system", "tool", "model", "text", "image_url",
                                     "function", "tool_use", "tool_result", "image", "base64", "url", "auto",
                                     "any", "required", "none", "STOP", "ANY", "end_turn", "data:image/png;base64,AA",
                                     "data:x", "{}", '{"a":1}', "[DONE]", ""]),
                    st.text(max_size=8))
JSON = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=4),
                                                 st.dictionaries(st.sampled_from(KEYS), c, max_size=5)),
                    max_leaves=30)


def _raises_only_modelyard_error(fn, *args, **kw) -> None:
    try:
        fn(*args, **kw)
    except ModelyardError as e:
        assert isinstance(e.status, int) and isinstance(e.message, str)


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(data=st.one_of(st.binary(max_size=200), JSON.map(orjson.dumps)))
def test_parse_request_random(proto: str, data: bytes) -> None:
    _raises_only_modelyard_error(PROTOCOLS[proto].parse_request, data, path_model="m")


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=6), value=JSON)
def test_parse_request_mutated_fixture(proto: str, path: list, value: object) -> None:
    raw = orjson.dumps(mutate(REQUESTS[proto], path, value))
    try:
        req = PROTOCOLS[proto].parse_request(raw, path_model="m")
    except ModelyardError:
        return
    # Whatever parses renders to every upstream, or is refused with a clear error (a document or
    # control the target cannot express), never a crash.
    for up in NAMES:
        _raises_only_modelyard_error(PROTOCOLS[up].render_request, req, upstream_model="u", credential="k")


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(kind=st.sampled_from(["text", "tool", "length"]), path=st.lists(st.integers(0, 50), max_size=6),
       value=JSON, raw=st.binary(max_size=100))
def test_parse_response_fuzz(proto: str, kind: str, path: list, value: object, raw: bytes) -> None:
    _raises_only_modelyard_error(PROTOCOLS[proto].parse_response, raw)
    mutated = orjson.dumps(mutate(RESPONSES[proto][kind], path, value))
    try:
        resp = PROTOCOLS[proto].parse_response(mutated)
    except ModelyardError:
        return
    for cl in NAMES:
        PROTOCOLS[cl].render_response(resp, model="m")


def _sse_lines(objs: list) -> bytes:
    return b"".join(b"data: " + orjson.dumps(o) + b"\n\n" for o in objs)


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), st.lists(JSON, max_size=4).map(_sse_lines)),
       cuts=st.lists(st.integers(0, 300), max_size=4), client=st.sampled_from(NAMES))
def test_stream_decoder_fuzz(proto: str, raw: bytes, cuts: list, client: str) -> None:
    d = PROTOCOLS[proto].StreamDecoder()
    tr = translate_stream(proto, client, CANONICAL)
    bounds = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    events = []
    for a, b in zip(bounds, bounds[1:]):
        events += d.feed(raw[a:b])
        assert isinstance(tr.feed(raw[a:b]), bytes)
    events += d.close()
    assert isinstance(tr.finish(), bytes)
    # A stream always ends in exactly one terminal event: never a hang.
    assert sum(isinstance(e, (StreamEnd, StreamError)) for e in events) == 1
    assert isinstance(events[-1], (StreamEnd, StreamError))


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(pos=st.integers(0, 10_000), junk=st.binary(min_size=1, max_size=8))
def test_stream_decoder_corrupted_fixture(proto: str, pos: int, junk: bytes) -> None:
    raw = STREAMS[proto]["tool"]
    p = pos % len(raw)
    d = PROTOCOLS[proto].StreamDecoder()
    events = d.feed(raw[:p] + junk + raw[p:]) + d.close()
    assert isinstance(events[-1], (StreamEnd, StreamError))


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(status=st.integers(100, 599), raw=st.one_of(st.binary(max_size=200), JSON.map(orjson.dumps)))
def test_parse_error_fuzz(proto: str, status: int, raw: bytes) -> None:
    msg = PROTOCOLS[proto].parse_error(status, raw)
    assert isinstance(msg, str) and msg


@FUZZ
@given(raw=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=5))
def test_sse_framer_is_split_invariant(raw: bytes, cuts: list) -> None:
    whole = SSEFramer()
    expected = whole.feed(raw) + whole.close()
    f = SSEFramer()
    bounds = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    got = []
    for a, b in zip(bounds, bounds[1:]):
        got += f.feed(raw[a:b])
    assert got + f.close() == expected


@pytest.mark.parametrize("proto", NAMES)
@FUZZ
@given(kind=st.sampled_from(["text", "tool"]), which=st.integers(0, 20), path=st.lists(st.integers(0, 50), max_size=5),
       value=JSON, client=st.sampled_from(NAMES))
def test_stream_with_mutated_event_json(proto: str, kind: str, which: int, path: list, value: object,
                                        client: str) -> None:
    f = SSEFramer()
    evs = f.feed(STREAMS[proto][kind]) + f.close()
    i = which % len(evs)
    raw = b""
    for j, ev in enumerate(evs):
        data = ev.data
        if j == i and data != b"[DONE]":
            data = orjson.dumps(mutate(orjson.loads(data), path, value))
        raw += (b"event: " + ev.event.encode() + b"\n" if ev.event else b"") + b"data: " + data + b"\n\n"
    tr = translate_stream(proto, client, CANONICAL)
    out = tr.feed(raw) + tr.finish()
    assert isinstance(out, bytes)
    assert tr.finished or tr.error is not None
