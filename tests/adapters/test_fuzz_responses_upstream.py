"""Hypothesis fuzzing of the Responses API as an upstream: its stream decoder and answer parser,
fed random and mutated typed events, raise nothing but our protocol errors, end every stream with
exactly one terminal event, and whatever they read translates to every chat client."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters import responses
from adapters.internal import StreamEnd, StreamError
from adapters.registry import PROTOCOLS, translate_stream
from adapters.sse import SSEFramer
from contracts.errors import ModelyardError
from devstack.demo.responses_server import EXTRA_ITEMS, _stream_with_item_first
from tests.adapters.fixtures import CANONICAL, RESPONSES, STREAMS
from tests.adapters.mutation import mutate
from tests.adapters.translation_checks import NAMES

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLIENTS = [*NAMES, "responses"]

EVENT_TYPES = ["response.created", "response.in_progress", "response.output_item.added", "response.output_item.done",
               "response.content_part.added", "response.content_part.done", "response.output_text.delta",
               "response.output_text.done", "response.refusal.delta", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.reasoning_summary_text.delta",
               "response.completed", "response.incomplete", "response.failed", "error"]
ITEM_TYPES = ["message", "function_call", "reasoning", "web_search_call", "custom_tool_call", "output_text",
              "refusal", "summary_text"]
KEYS = ["type", "response", "item", "item_id", "output_index", "content_index", "delta", "text", "arguments", "id",
        "call_id", "name", "output", "usage", "input_tokens", "output_tokens", "status", "error", "message",
        "incomplete_details", "reason", "summary", "content", "part", "model"]
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.text(max_size=6),
                    st.sampled_from(EVENT_TYPES + ITEM_TYPES + ["fc_1", "msg_1", "completed", "incomplete", "{}"]))
JSON = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                 st.dictionaries(st.sampled_from(KEYS), c, max_size=5)),
                    max_leaves=25)
EVENT = st.builds(lambda t, rest: {**rest, "type": t}, st.sampled_from(EVENT_TYPES),
                  st.dictionaries(st.sampled_from(KEYS), JSON, max_size=5))


def _sse(events: list[object]) -> bytes:
    out = b""
    for e in events:
        t = e.get("type") if isinstance(e, dict) else None
        out += (b"event: " + t.encode() + b"\n" if isinstance(t, str) else b"") + b"data: " + orjson.dumps(e) + b"\n\n"
    return out


def _run(raw: bytes, cuts: list[int], client: str) -> list:
    d = responses.StreamDecoder()
    tr = translate_stream("responses", client, CANONICAL)
    bounds = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    events = []
    for a, b in zip(bounds, bounds[1:]):
        events += d.feed(raw[a:b])
        assert isinstance(tr.feed(raw[a:b]), bytes)
    events += d.close()
    assert isinstance(tr.finish(), bytes)
    assert tr.finished or tr.error is not None
    # A stream always ends in exactly one terminal event, and nothing follows it.
    assert sum(isinstance(e, (StreamEnd, StreamError)) for e in events) == 1
    assert isinstance(events[-1], (StreamEnd, StreamError))
    return events


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), st.lists(st.one_of(EVENT, JSON), max_size=6).map(_sse)),
       cuts=st.lists(st.integers(0, 400), max_size=4), client=st.sampled_from(CLIENTS))
def test_random_streams(raw: bytes, cuts: list, client: str) -> None:
    _run(raw, cuts, client)


def _fixture_streams() -> list[bytes]:
    text = STREAMS["responses"]["text"]
    return [text, STREAMS["responses"]["tool"],
            *(_stream_with_item_first(text, item) for item in EXTRA_ITEMS.values())]


@FUZZ
@given(which_stream=st.integers(0, 20), which=st.integers(0, 40), path=st.lists(st.integers(0, 50), max_size=5),
       value=JSON, cuts=st.lists(st.integers(0, 3000), max_size=3), client=st.sampled_from(CLIENTS))
def test_streams_with_a_mutated_event(which_stream: int, which: int, path: list, value: object, cuts: list,
                                      client: str) -> None:
    streams = _fixture_streams()
    f = SSEFramer()
    evs = f.feed(streams[which_stream % len(streams)]) + f.close()
    i = which % len(evs)
    objs = [orjson.loads(e.data) for e in evs]
    objs[i] = mutate(objs[i], path, value)
    _run(_sse(objs), cuts, client)


@FUZZ
@given(pos=st.integers(0, 10_000), junk=st.binary(min_size=1, max_size=8), client=st.sampled_from(CLIENTS))
def test_corrupted_bytes(pos: int, junk: bytes, client: str) -> None:
    raw = STREAMS["responses"]["tool"]
    p = pos % len(raw)
    _run(raw[:p] + junk + raw[p:], [], client)


@pytest.mark.parametrize("kind", ["text", "tool", "length"])
@FUZZ
@given(path=st.lists(st.integers(0, 50), max_size=6), value=JSON, raw=st.binary(max_size=100))
def test_answers(kind: str, path: list, value: object, raw: bytes) -> None:
    for body in (raw, orjson.dumps(mutate(RESPONSES["responses"][kind], path, value))):
        try:
            resp = responses.parse_response(body)
        except ModelyardError as e:
            assert isinstance(e.status, int) and isinstance(e.message, str)
            continue
        for client in CLIENTS:
            PROTOCOLS[client].render_response(resp, model="m")


REQUEST_KEYS = ["model", "input", "instructions", "tools", "tool_choice", "type", "name", "role", "content", "text",
                "call_id", "arguments", "output", "reasoning", "effort", "summary", "parameters", "stream",
                "max_output_tokens", "temperature"]
REQUEST_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.text(max_size=6),
              st.sampled_from(["user", "assistant", "message", "function", "function_call", "function_call_output",
                               "reasoning", "web_search", "file_search", "input_text", "auto", "m"])),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.sampled_from(REQUEST_KEYS), c, max_size=5)),
    max_leaves=25)


@FUZZ
@given(body=st.dictionaries(st.sampled_from(REQUEST_KEYS), REQUEST_JSON, max_size=6))
def test_requests_parse_and_render_or_refuse(body: dict) -> None:
    """Whatever parses renders for every upstream unless it holds what only a Responses one takes."""
    try:
        req = responses.parse_request(orjson.dumps({"model": "m", **body}))
    except ModelyardError as e:
        assert e.status == 400
        return
    for up in CLIENTS:
        try:
            PROTOCOLS[up].render_request(req, upstream_model="u", credential="k")
        except ModelyardError as e:
            assert e.status == 400
