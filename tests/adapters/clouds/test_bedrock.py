"""Bedrock Converse and ConverseStream against a recorded stream (recorded/SOURCES.md) and AWS's
documented shapes: the request each client protocol becomes, SigV4 as botocore verifies it, and
the binary eventstream cut anywhere, corrupted, or ended early."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters import anthropic, bedrock, gemini, openai
from adapters.bedrock.eventstream import encode_frame
from adapters.bedrock.signing import verify
from adapters.cloud_targets import AwsCredentials, BedrockTarget
from adapters.internal import (
    RenderOptions,
    StreamEnd,
    StreamError,
    StreamFinish,
    StreamStart,
    TextDelta,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)
from adapters.registry import translate_stream
from contracts.errors import ClientError

RECORDED = (Path(__file__).parent / "recorded" / "bedrock-converse-stream-tool-use.bin").read_bytes()
CREDS = AwsCredentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
TEMP = AwsCredentials("ASIAEXAMPLE", "secret/temporary", "session-token-value")
OPTIONS = RenderOptions(cloud=BedrockTarget("us-east-1", "bedrock-runtime.us-east-1.amazonaws.com", CREDS))
MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"


def _render(body: dict, proto=openai, options: RenderOptions = OPTIONS, **kw):
    req = proto.parse_request(orjson.dumps(body), **kw)
    return bedrock.render_request(req, upstream_model=MODEL, credential=None, options=options)


# ---- requests ----------------------------------------------------------------------------------

def test_openai_request_with_tools_becomes_converse() -> None:
    up = _render({"model": "m", "max_tokens": 50, "temperature": 1.5, "top_p": 0.9, "stop": ["END"],
                  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w",
                                                              "parameters": {"type": "object"}}}],
                  "tool_choice": "required",
                  "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "weather?"},
                               {"role": "assistant", "content": None, "tool_calls": [
                                   {"id": "c1", "type": "function",
                                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
                               {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
                               {"role": "user", "content": "thanks"}]})
    assert up.path == "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    assert orjson.loads(up.body) == {
        "messages": [
            {"role": "user", "content": [{"text": "weather?"}]},
            {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c1", "name": "get_weather",
                                                           "input": {"city": "Oslo"}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "c1", "content": [{"text": "sunny"}],
                                                         "status": "success"}}, {"text": "thanks"}]},
        ],
        "system": [{"text": "be brief"}],
        "inferenceConfig": {"maxTokens": 50, "temperature": 1.0, "topP": 0.9, "stopSequences": ["END"]},
        "toolConfig": {"tools": [{"toolSpec": {"name": "get_weather", "description": "w",
                                               "inputSchema": {"json": {"type": "object"}}}}],
                       "toolChoice": {"any": {}}},
    }


def test_streamed_anthropic_request_with_an_image_goes_to_converse_stream() -> None:
    up = _render({"model": "m", "max_tokens": 10, "stream": True, "top_k": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "text", "text": "what is it"}]}]}, anthropic)
    assert up.path.endswith("/converse-stream") and up.headers["accept"] == "application/vnd.amazon.eventstream"
    body = orjson.loads(up.body)
    assert body["messages"][0]["content"][0] == {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}
    assert body["additionalModelRequestFields"] == {"top_k": 5}


@pytest.mark.parametrize(("body", "words"), [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none"}, "tool_choice none"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": False}, "parallel"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]},
     "not URLs"),
], ids=["response_format", "tool_choice-none", "parallel_tool_calls-false", "image-url"])
def test_what_bedrock_cannot_take_is_refused(body: dict, words: str) -> None:
    with pytest.raises(ClientError) as e:
        _render({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body})
    assert words in e.value.message and e.value.status == 400


def test_gemini_client_request_round_trips_through_the_demo_parser() -> None:
    up = _render({"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
                  "generationConfig": {"maxOutputTokens": 7}}, gemini, path_model="gemini-x")
    back = bedrock.parse_request(up.body, path_model=MODEL, stream_hint=False)
    assert back.model == MODEL and back.max_tokens == 7 and back.messages[0].content[0].text == "hi"  # type: ignore[union-attr]


# ---- SigV4 -------------------------------------------------------------------------------------

@pytest.mark.parametrize("creds", [CREDS, TEMP], ids=["static", "temporary"])
def test_signature_verifies_as_botocore_computes_it(creds: AwsCredentials) -> None:
    opts = RenderOptions(cloud=BedrockTarget("eu-west-1", "127.0.0.1:8107", creds))
    up = _render({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, options=opts)
    assert up.headers["host"] == "127.0.0.1:8107"
    assert up.headers["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={creds.access_key}/")
    assert ("x-amz-security-token" in up.headers) == (creds.session_token is not None)
    assert verify("POST", up.path, up.headers, up.body, region="eu-west-1", creds=creds) is None
    # Any change the signature covers is caught: body, path, region, secret, clock.
    assert verify("POST", up.path, up.headers, up.body + b" ", region="eu-west-1", creds=creds) is not None
    assert verify("POST", up.path.replace("converse", "converse-stream"), up.headers, up.body, region="eu-west-1",
                  creds=creds) is not None
    assert verify("POST", up.path, up.headers, up.body, region="us-east-1", creds=creds) is not None
    assert verify("POST", up.path, up.headers, up.body, region="eu-west-1",
                  creds=AwsCredentials(creds.access_key, "other", creds.session_token)) is not None
    later = datetime.now(UTC) + timedelta(minutes=6)
    assert "expired" in (verify("POST", up.path, up.headers, up.body, region="eu-west-1", creds=creds, now=later) or "")


def test_credentials_never_show_in_repr() -> None:
    assert "wJalr" not in repr(OPTIONS) and "session-token" not in repr(TEMP)


# ---- responses ---------------------------------------------------------------------------------

CONVERSE_ANSWER = orjson.dumps({
    "output": {"message": {"role": "assistant", "content": [
        {"text": "Let me check."},
        {"toolUse": {"toolUseId": "tooluse_abc", "name": "get_weather", "input": {"city": "Oslo"}}}]}},
    "stopReason": "tool_use", "usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19},
    "metrics": {"latencyMs": 321}})


def test_converse_answer_to_each_client() -> None:
    resp = bedrock.parse_response(CONVERSE_ANSWER)
    assert (resp.content, resp.finish_reason, resp.usage.input_tokens, resp.usage.output_tokens) == \
        ("Let me check.", "tool_calls", 12, 7)
    assert resp.tool_calls[0].name == "get_weather" and orjson.loads(resp.tool_calls[0].arguments) == {"city": "Oslo"}
    oa = orjson.loads(openai.render_response(resp, model="demo-bedrock"))
    assert oa["choices"][0]["finish_reason"] == "tool_calls"
    an = orjson.loads(anthropic.render_response(resp, model="demo-bedrock"))
    assert an["stop_reason"] == "tool_use" and an["content"][1]["input"] == {"city": "Oslo"}


@pytest.mark.parametrize(("reason", "finish"), [("end_turn", "stop"), ("max_tokens", "length"),
                                                ("guardrail_intervened", "content_filter"),
                                                ("content_filtered", "content_filter"), ("stop_sequence", "stop")])
def test_stop_reasons(reason: str, finish: str) -> None:
    body = {"output": {"message": {"role": "assistant", "content": [{"text": "x"}]}}, "stopReason": reason,
            "usage": {"inputTokens": 1, "outputTokens": 1}}
    assert bedrock.parse_response(orjson.dumps(body)).finish_reason == finish


def test_error_bodies() -> None:
    assert bedrock.parse_error(400, b'{"message":"Malformed input request: #: extraneous key"}') == \
        "Malformed input request: #: extraneous key"
    assert bedrock.parse_error(403, b'{"Message":"User is not authorized"}') == "User is not authorized"
    assert bedrock.parse_error(500, b"<html>") == "upstream returned HTTP 500"


# ---- the recorded stream, cut anywhere ---------------------------------------------------------

def _decode(data: bytes, step: int) -> list:
    dec = bedrock.StreamDecoder()
    out = []
    for i in range(0, len(data), step):
        out += dec.feed(data[i:i + step])
    return out + dec.close()


@pytest.mark.parametrize("step", [len(RECORDED), 4096, 97, 13, 1])
def test_recorded_stream_decodes_the_same_however_it_is_split(step: int) -> None:
    events = _decode(RECORDED, step)
    assert events[0] == StreamStart("", "")
    text = "".join(e.text for e in events if type(e) is TextDelta)
    assert text == ("To calculate the cosine of 7, we can use the \"cosine\" function that is available to us. "
                    "Let's use this function to get the result.")
    assert ToolCallStart(0, "tooluse_QklrEHKjRu6Oc4BQUfy7ZQ", "cosine") in events
    assert "".join(e.arguments for e in events if type(e) is ToolCallDelta) == '{"x": 7}'
    assert events[-3:] == [StreamFinish("tool_calls"), UsageUpdate(386, 75), StreamEnd()]


@pytest.mark.parametrize("client", ["openai", "anthropic", "gemini", "responses"])
def test_recorded_stream_reaches_every_client(client: str) -> None:
    body = {"openai": b'{"model":"m","stream":true,"messages":[{"role":"user","content":"cos 7"}]}',
            "anthropic": b'{"model":"m","max_tokens":9,"stream":true,"messages":[{"role":"user","content":"cos 7"}]}',
            "gemini": b'{"contents":[{"role":"user","parts":[{"text":"cos 7"}]}]}',
            "responses": b'{"model":"m","stream":true,"input":"cos 7"}'}[client]
    from adapters.registry import PROTOCOLS
    req = PROTOCOLS[client].parse_request(body, path_model="m", stream_hint=True)
    tr = translate_stream("bedrock", client, req)
    out = b"".join(tr.feed(RECORDED[i:i + 50]) for i in range(0, len(RECORDED), 50)) + tr.finish()
    assert tr.finished and tr.error is None
    assert b"cosine" in out and (tr.meter.reported.input_tokens, tr.meter.reported.output_tokens) == (386, 75)


def _first_frame_len(data: bytes) -> int:
    return struct.unpack("!I", data[:4])[0]


@pytest.mark.parametrize("where", ["prelude", "payload", "message crc"])
def test_a_crc_failure_ends_the_stream_as_a_bad_gateway(where: str) -> None:
    n = _first_frame_len(RECORDED)
    pos = {"prelude": 9, "payload": n - 10, "message crc": n - 1}[where]
    broken = RECORDED[:pos] + bytes([RECORDED[pos] ^ 0xFF]) + RECORDED[pos + 1:]
    events = _decode(broken, 64)
    assert type(events[-1]) is StreamError and "502" in events[-1].message and "CRC" in events[-1].message
    assert not any(type(e) is StreamEnd for e in events)
    req = openai.parse_request(b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}')
    tr = translate_stream("bedrock", "openai", req)
    out = tr.feed(broken) + tr.finish()
    assert tr.error is not None and b'"error"' in out and b"502 Bad Gateway" in out


def test_an_impossible_length_is_corrupt_not_a_hang() -> None:
    frame = struct.pack("!II", 4, 0)
    from binascii import crc32
    frame += struct.pack("!I", crc32(frame)) + b"\x00" * 8
    events = _decode(frame, 3)
    assert type(events[-1]) is StreamError and "502" in events[-1].message


@pytest.mark.parametrize("cut", [10, 200, len(RECORDED) - 300])
def test_a_stream_cut_before_message_stop_is_an_error(cut: int) -> None:
    events = _decode(RECORDED[:cut], 32)
    assert type(events[-1]) is StreamError and "before messageStop" in events[-1].message


def test_exception_frames_are_stream_errors() -> None:
    frames = encode_frame({":event-type": "messageStart", ":content-type": "application/json",
                           ":message-type": "event"}, b'{"role":"assistant"}')
    frames += encode_frame({":exception-type": "throttlingException", ":content-type": "application/json",
                            ":message-type": "exception"}, b'{"message":"Too many requests"}')
    events = _decode(frames, 11)
    assert events[-1] == StreamError("upstream throttlingException: Too many requests", "api_error")


def test_demo_encoder_round_trips() -> None:
    enc = bedrock.StreamEncoder(model="m")
    evs = [StreamStart("", ""), TextDelta("a"), ToolCallStart(0, "t1", "f"), ToolCallDelta(0, "{}"),
           StreamFinish("tool_calls"), UsageUpdate(3, 4), StreamEnd()]
    assert _decode(enc.encode(evs), 7) == [StreamStart("", ""), TextDelta("a"), ToolCallStart(0, "t1", "f"),
                                           ToolCallDelta(0, "{}"), StreamFinish("tool_calls"), UsageUpdate(3, 4),
                                           StreamEnd()]


@pytest.mark.parametrize("cloud", ["azure-openai", "bedrock", "vertex"])
def test_every_cloud_reads_every_error_shape(cloud: str) -> None:
    from adapters.registry import PROTOCOLS

    mod = PROTOCOLS[cloud]
    for other in ("openai", "anthropic", "gemini", "azure-openai", "bedrock", "vertex"):
        assert mod.parse_error(500, PROTOCOLS[other].render_error(500, "boom")) == "boom"
    assert mod.parse_error(502, b"Traceback (most recent call last):\n  File \"/srv/app.py\"") == \
        "upstream returned HTTP 502"


@settings(max_examples=150, deadline=None)
@given(pos=st.integers(0, len(RECORDED) - 1), flip=st.integers(1, 255), step=st.integers(1, 300))
def test_any_corrupted_byte_ends_in_an_error_never_an_exception(pos: int, flip: int, step: int) -> None:
    broken = RECORDED[:pos] + bytes([RECORDED[pos] ^ flip]) + RECORDED[pos + 1:]
    events = _decode(broken, step)
    assert type(events[-1]) is StreamError  # every byte is under a CRC: no corruption passes as an answer


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=600), step=st.integers(1, 64))
def test_arbitrary_bytes_never_raise(data: bytes, step: int) -> None:
    events = _decode(data, step)
    assert events and type(events[-1]) is StreamError
