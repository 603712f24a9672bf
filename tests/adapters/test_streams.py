"""Stream translation: decoders over split/cut bytes, encoders checked by the real SDK types."""

from __future__ import annotations

import pytest

from adapters import anthropic, gemini, openai
from adapters.internal import (
    ChatRequest,
    Message,
    StreamEnd,
    StreamError,
    StreamFinish,
    StreamStart,
    TextDelta,
    TextPart,
    ToolCallDelta,
    ToolCallStart,
    UsageUpdate,
)
from adapters.registry import translate_stream
from tests.adapters.fixtures import STREAM_MEANING, STREAMS
from tests.adapters.translation_checks import NAMES, client_events, decode, summary

REQ = ChatRequest("client-model", (Message("user", (TextPart("hi"),)),), stream=True, include_usage=True)


CASES = [(p, k) for p in NAMES for k in ("text", "tool")]


@pytest.mark.parametrize(("proto", "kind"), CASES)
def test_decode_whole_stream(proto: str, kind: str) -> None:
    events = decode(proto, [STREAMS[proto][kind]])
    assert summary(events) == STREAM_MEANING[kind]
    assert isinstance(next(e for e in events if not isinstance(e, UsageUpdate)), StreamStart)


@pytest.mark.parametrize(("proto", "kind"), CASES)
def test_split_at_every_byte_offset(proto: str, kind: str) -> None:
    raw = STREAMS[proto][kind]
    whole = decode(proto, [raw])
    for cut in range(1, len(raw)):
        assert decode(proto, [raw[:cut], raw[cut:]]) == whole, cut


@pytest.mark.parametrize(("proto", "kind"), CASES)
def test_byte_by_byte_and_crlf(proto: str, kind: str) -> None:
    raw = STREAMS[proto][kind]
    whole = decode(proto, [raw])
    assert decode(proto, [raw[i:i + 1] for i in range(len(raw))]) == whole
    crlf = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    assert decode(proto, [crlf[i:i + 1] for i in range(len(crlf))]) == whole
    cr = raw.replace(b"\r\n", b"\n").replace(b"\n", b"\r")
    assert decode(proto, [cr[i:i + 7] for i in range(0, len(cr), 7)]) == whole


@pytest.mark.parametrize(("proto", "kind"), CASES)
def test_cut_short_streams_end_with_an_error_event(proto: str, kind: str) -> None:
    raw = STREAMS[proto][kind]
    # Gemini has no terminator: a stream is whole once its finishReason chunk arrived.
    end = raw.rindex(b"data:") if proto != "gemini" else raw.rindex(b"data:") + 10
    for cut in range(0, end, 3):
        events = decode(proto, [raw[:cut]])
        assert isinstance(events[-1], StreamError), (cut, events[-3:])
        assert sum(isinstance(e, (StreamEnd, StreamError)) for e in events) == 1


@pytest.mark.parametrize("proto", NAMES)
def test_upstream_error_events(proto: str) -> None:
    raw = {
        "openai": b'data: {"error":{"message":"boom","type":"server_error"}}\n\n',
        "anthropic": b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"boom"}}\n\n',
        "gemini": b'data: {"error":{"code":500,"message":"boom","status":"INTERNAL"}}\r\n\r\n',
    }[proto]
    events = decode(proto, [raw])
    assert isinstance(events[-1], StreamError) and events[-1].message == "boom"
    assert decode(proto, [b"data: {not json\n\n"])[-1] == StreamError("upstream sent a malformed stream chunk"
                                                                      if proto != "anthropic" else
                                                                      "upstream sent a malformed stream event")


def test_anthropic_block_indices_for_text_then_tools() -> None:
    enc = anthropic.StreamEncoder(model="m", request=REQ)
    out = enc.encode([StreamStart("id", "u"), TextDelta("a"), ToolCallStart(0, "c0", "f"), ToolCallDelta(0, "{}"),
                      ToolCallStart(1, "c1", "g"), ToolCallDelta(1, '{"x":'), ToolCallDelta(1, "1}"),
                      StreamFinish("tool_calls"), UsageUpdate(3, 4), StreamEnd()])
    evs = client_events("anthropic", out)
    seq = [(e["type"], e.get("index")) for e in evs]
    assert seq == [("message_start", None), ("content_block_start", 0), ("content_block_delta", 0),
                   ("content_block_stop", 0), ("content_block_start", 1), ("content_block_delta", 1),
                   ("content_block_stop", 1), ("content_block_start", 2), ("content_block_delta", 2),
                   ("content_block_delta", 2), ("content_block_stop", 2), ("message_delta", None),
                   ("message_stop", None)]
    assert evs[-2]["delta"]["stop_reason"] == "tool_use" and evs[-2]["usage"]["output_tokens"] == 4


def test_openai_usage_chunk_only_when_asked() -> None:
    events = decode("anthropic", [STREAMS["anthropic"]["text"]])
    plain = ChatRequest("m", REQ.messages, stream=True)
    no_usage = openai.StreamEncoder(model="m", request=plain).encode(events)
    with_usage = openai.StreamEncoder(model="m", request=REQ).encode(events)
    assert b'"usage"' not in no_usage and b'"usage"' in with_usage
    assert no_usage.endswith(b"data: [DONE]\n\n") and with_usage.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("client", NAMES)
def test_cut_upstream_gives_client_an_error_event(client: str) -> None:
    raw = STREAMS["openai"]["text"]
    tr = translate_stream("openai", client, REQ)
    out = tr.feed(raw[: len(raw) // 2]) + tr.finish()
    assert not tr.finished and tr.error
    last = client_events(client, out)[-1]
    assert "error" in last
    if client == "anthropic":
        assert last["type"] == "error"


def test_gemini_encoder_joins_tool_argument_fragments() -> None:
    enc = gemini.StreamEncoder(model="m", request=REQ)
    out = enc.encode([StreamStart("r", "u"), ToolCallStart(0, "c", "f"), ToolCallDelta(0, '{"a"'),
                      ToolCallDelta(0, ":1}"), StreamFinish("tool_calls"), UsageUpdate(1, 2), StreamEnd()])
    last = client_events("gemini", out)[-1]
    assert last["candidates"][0]["content"]["parts"] == [{"functionCall": {"name": "f", "args": {"a": 1}}}]
    assert last["usageMetadata"]["totalTokenCount"] == 3
