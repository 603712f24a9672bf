"""Prompt-cache markers across protocols (issue 39): an Anthropic caller's `cache_control` becomes
Bedrock Converse `cachePoint` blocks right after the marked block (system, message content,
toolConfig.tools), Anthropic-shaped upstreams (Anthropic, Vertex Claude) get `cache_control` back
from the hub, and past four markers the earliest go."""

from __future__ import annotations

import orjson
import pytest

from adapters import anthropic, bedrock, vertex
from adapters.cache_marks import MAX_CACHE_MARKS, capped, mark_count
from adapters.cloud_targets import AwsCredentials, BedrockTarget, VertexTarget
from adapters.internal import ChatRequest, Message, RenderOptions, TextPart, ToolDef
from contracts.errors import ClientError

BEDROCK = RenderOptions(cloud=BedrockTarget("us-east-1", "bedrock-runtime.us-east-1.amazonaws.com",
                                            AwsCredentials("AKIDEXAMPLE", "secret")))
VERTEX_CLAUDE = RenderOptions(cloud=VertexTarget("p", "us-east5", "anthropic"))
EPH = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
POINT = {"cachePoint": {"type": "default"}}
POINT_1H = {"cachePoint": {"type": "default", "ttl": "1h"}}
SCHEMA = {"type": "object", "properties": {}}


def _anthropic_body(**over: object) -> bytes:
    body: dict[str, object] = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    body.update(over)
    return orjson.dumps(body)


def _to_bedrock(body: bytes) -> dict:
    req = anthropic.parse_request(body)
    return orjson.loads(bedrock.render_request(req, upstream_model="anthropic.claude", credential=None,
                                               options=BEDROCK).body)


# (case, the Anthropic request's fields, the Converse field and the list expected there)
CASES = [
    ("system-block", {"system": [{"type": "text", "text": "long prefix", "cache_control": EPH},
                                 {"type": "text", "text": " tail"}]},
     "system", [{"text": "long prefix"}, POINT, {"text": " tail"}]),
    ("system-1h", {"system": [{"type": "text", "text": "long prefix", "cache_control": HOUR}]},
     "system", [{"text": "long prefix"}, POINT_1H]),
    ("system-unmarked-stays-one-string", {"system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
     "system", [{"text": "ab"}]),
    ("tools", {"tools": [{"name": "a", "input_schema": SCHEMA}, {"name": "b", "input_schema": SCHEMA,
                                                                "cache_control": EPH}]},
     "tools", [{"toolSpec": {"name": "a", "inputSchema": {"json": SCHEMA}}},
               {"toolSpec": {"name": "b", "inputSchema": {"json": SCHEMA}}}, POINT]),
    ("message-text", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "doc", "cache_control": EPH}, {"type": "text", "text": "question"}]}]},
     "messages", [{"role": "user", "content": [{"text": "doc"}, POINT, {"text": "question"}]}]),
    ("image", {"messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
         "cache_control": HOUR}]}]},
     "messages", [{"role": "user", "content": [{"image": {"format": "png", "source": {"bytes": "aGk="}}}, POINT_1H]}]),
    ("tool-result", {"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "w", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny",
                                      "cache_control": EPH}, {"type": "text", "text": "and?"}]}]},
     "messages", [{"role": "user", "content": [{"text": "weather?"}]},
                  {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "w", "input": {}}}]},
                  {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "sunny"}],
                                                               "status": "success"}}, POINT, {"text": "and?"}]}]),
]


@pytest.mark.parametrize(("name", "fields", "key", "expected"), CASES, ids=[c[0] for c in CASES])
def test_anthropic_markers_become_cache_points_after_the_marked_block(name: str, fields: dict, key: str,
                                                                      expected: list) -> None:
    out = _to_bedrock(_anthropic_body(**fields))
    got = out["toolConfig"]["tools"] if key == "tools" else out[key]
    assert got == expected


def test_no_markers_no_cache_points() -> None:
    out = _to_bedrock(_anthropic_body(system="plain", tools=[{"name": "a", "input_schema": SCHEMA}]))
    assert "cachePoint" not in orjson.dumps(out).decode()


def _five_marks() -> bytes:
    return _anthropic_body(
        tools=[{"name": "a", "input_schema": SCHEMA, "cache_control": EPH}],
        system=[{"type": "text", "text": "s", "cache_control": EPH}],
        messages=[{"role": "user", "content": [{"type": "text", "text": f"m{i}", "cache_control": EPH}
                                               for i in range(3)]}])


def test_past_four_markers_the_earliest_go() -> None:
    req = anthropic.parse_request(_five_marks())
    assert mark_count(req) == 5
    kept = capped(req)
    assert mark_count(kept) == MAX_CACHE_MARKS
    assert kept.tools[0].cache is None  # tools come first in the prompt: the earliest marker
    assert kept.system_blocks[0].cache == "5m"
    out = _to_bedrock(_five_marks())
    assert out["toolConfig"]["tools"] == [{"toolSpec": {"name": "a", "inputSchema": {"json": SCHEMA}}}]
    assert orjson.dumps(out).decode().count("cachePoint") == MAX_CACHE_MARKS


def test_capped_leaves_four_or_fewer_alone() -> None:
    req = ChatRequest("m", (Message("user", (TextPart("a", "5m"),)),), tools=(ToolDef("t", cache="1h"),))
    assert capped(req) is req


@pytest.mark.parametrize("bad", [{"type": "persistent"}, {"type": "ephemeral", "ttl": "2h"}, "ephemeral"])
def test_a_malformed_cache_control_is_a_400(bad: object) -> None:
    with pytest.raises(ClientError) as e:
        anthropic.parse_request(_anthropic_body(system=[{"type": "text", "text": "s", "cache_control": bad}]))
    assert e.value.status == 400 and "cache_control" in e.value.message


# ---- the other way: a Converse request's cachePoints, and Anthropic-shaped upstreams ------------

CONVERSE = {
    "system": [{"text": "long prefix"}, POINT_1H],
    "toolConfig": {"tools": [{"toolSpec": {"name": "w", "inputSchema": {"json": SCHEMA}}}, POINT]},
    "messages": [{"role": "user", "content": [{"text": "doc"}, POINT, {"text": "question"}]}],
}


def test_converse_cache_points_mark_the_block_before_them() -> None:
    req = bedrock.parse_request(orjson.dumps(CONVERSE), path_model="m")
    assert req.system == "long prefix" and req.system_blocks == (TextPart("long prefix", "1h"),)
    assert req.tools[0].cache == "5m"
    assert req.messages[0].content == (TextPart("doc", "5m"), TextPart("question"))


def test_converse_round_trip_keeps_every_cache_point() -> None:
    req = bedrock.parse_request(orjson.dumps(CONVERSE), path_model="m")
    out = orjson.loads(bedrock.render_request(req, upstream_model="m", credential=None, options=BEDROCK).body)
    assert (out["system"], out["toolConfig"]["tools"], out["messages"]) == (
        CONVERSE["system"], CONVERSE["toolConfig"]["tools"], CONVERSE["messages"])


ANTHROPIC_OUT = {
    "system": [{"type": "text", "text": "long prefix", "cache_control": HOUR}],
    "tools": [{"name": "w", "input_schema": SCHEMA, "cache_control": EPH}],
    "messages": [{"role": "user", "content": [{"type": "text", "text": "doc", "cache_control": EPH},
                                              {"type": "text", "text": "question"}]}],
}


def test_an_anthropic_upstream_gets_cache_control_from_converse_markers() -> None:
    req = bedrock.parse_request(orjson.dumps(CONVERSE), path_model="m")
    out = orjson.loads(anthropic.render_request(req, upstream_model="claude", credential=None).body)
    assert {k: out[k] for k in ANTHROPIC_OUT} == ANTHROPIC_OUT


def test_anthropic_markers_survive_a_render_to_anthropic_and_vertex_claude() -> None:
    body = _anthropic_body(**ANTHROPIC_OUT)
    req = anthropic.parse_request(body)
    direct = orjson.loads(anthropic.render_request(req, upstream_model="claude", credential=None).body)
    on_vertex = orjson.loads(vertex.render_request(req, upstream_model="claude", credential=None,
                                                   options=VERTEX_CLAUDE).body)
    for out in (direct, on_vertex):
        assert {k: out[k] for k in ANTHROPIC_OUT} == ANTHROPIC_OUT


def test_anthropic_to_anthropic_passthrough_keeps_markers_as_sent() -> None:
    body = _anthropic_body(**ANTHROPIC_OUT)
    req = anthropic.parse_request(body)
    sent, _ = anthropic.passthrough_body(body, req, upstream_model="claude")
    assert {k: orjson.loads(sent)[k] for k in ANTHROPIC_OUT} == ANTHROPIC_OUT
