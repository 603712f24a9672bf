"""Vertex AI: Gemini and Claude at publisher paths, the body changes Claude on Vertex needs, and
answers and streams told apart by shape. Streams are the recorded Gemini and Anthropic ones
(tests/adapters/conformance/data, sources in its SOURCES.md), which Vertex sends unchanged."""

from __future__ import annotations

import orjson
import pytest

from adapters import anthropic, gemini, openai, vertex
from adapters.cloud_targets import VertexTarget
from adapters.internal import RenderOptions, StreamEnd, StreamError, TextDelta
from adapters.registry import translate_stream

GEMINI = RenderOptions(cloud=VertexTarget("my-proj", "us-central1"))
CLAUDE = RenderOptions(cloud=VertexTarget("my-proj", "us-east5", "anthropic"))
CHAT = b'{"model":"m","max_tokens":20,"messages":[{"role":"system","content":"sys"},{"role":"user","content":"hi"}]}'


@pytest.mark.parametrize(("options", "model", "stream", "path"), [
    (GEMINI, "gemini-2.0-flash-001", False,
     "/v1/projects/my-proj/locations/us-central1/publishers/google/models/gemini-2.0-flash-001:generateContent"),
    (GEMINI, "gemini-2.0-flash-001", True, "/v1/projects/my-proj/locations/us-central1/publishers/google/models/"
                                           "gemini-2.0-flash-001:streamGenerateContent?alt=sse"),
    (CLAUDE, "claude-3-5-sonnet-v2@20241022", False,
     "/v1/projects/my-proj/locations/us-east5/publishers/anthropic/models/claude-3-5-sonnet-v2@20241022:rawPredict"),
    (CLAUDE, "claude-3-5-sonnet-v2@20241022", True, "/v1/projects/my-proj/locations/us-east5/publishers/anthropic/"
                                                    "models/claude-3-5-sonnet-v2@20241022:streamRawPredict"),
], ids=["gemini", "gemini-stream", "claude", "claude-stream"])
def test_paths_and_bearer(options: RenderOptions, model: str, stream: bool, path: str) -> None:
    req = openai.parse_request(CHAT, stream_hint=stream)
    up = vertex.render_request(req, upstream_model=model, credential="ya29.token", options=options)
    assert up.path == path
    assert up.headers == {"content-type": "application/json", "authorization": "Bearer ya29.token"}


def test_claude_on_vertex_body() -> None:
    req = openai.parse_request(CHAT, stream_hint=True)
    body = orjson.loads(vertex.render_request(req, upstream_model="claude-x", credential="t", options=CLAUDE).body)
    assert body["anthropic_version"] == "vertex-2023-10-16" and "model" not in body
    assert body["system"] == "sys" and body["max_tokens"] == 20 and body["stream"] is True
    plain = orjson.loads(anthropic.render_request(req, upstream_model="claude-x", credential=None).body)
    assert {k: v for k, v in plain.items() if k != "model"} == {k: v for k, v in body.items()
                                                                if k != "anthropic_version"}


def test_gemini_on_vertex_body_is_gemini_s() -> None:
    req = openai.parse_request(CHAT)
    up = vertex.render_request(req, upstream_model="g", credential=None, options=GEMINI)
    assert up.body == gemini.render_request(req, upstream_model="g", credential=None).body
    assert "authorization" not in up.headers


GEMINI_ANSWER = orjson.dumps({"candidates": [{"content": {"role": "model", "parts": [{"text": "hello"}]},
                                              "finishReason": "STOP"}],
                              "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1},
                              "modelVersion": "gemini-2.0-flash-001"})
CLAUDE_ANSWER = orjson.dumps({"id": "msg_vrtx_01", "type": "message", "role": "assistant",
                              "model": "claude-3-5-sonnet-v2-20241022",
                              "content": [{"type": "text", "text": 'the key "candidates": is just text'}],
                              "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 7}})


def test_answers_told_apart_by_shape() -> None:
    g = vertex.parse_response(GEMINI_ANSWER)
    c = vertex.parse_response(CLAUDE_ANSWER)
    assert (g.content, g.usage.input_tokens) == ("hello", 3)
    assert (c.id, c.content, c.usage.output_tokens) == ("msg_vrtx_01", 'the key "candidates": is just text', 7)


def test_google_error_body() -> None:
    body = b'{"error":{"code":403,"message":"Permission denied on resource project p.","status":"PERMISSION_DENIED"}}'
    assert vertex.parse_error(403, body) == "Permission denied on resource project p."


def _stream(events_module, text: str) -> bytes:
    from adapters.internal import StreamFinish, StreamStart, UsageUpdate
    req = openai.parse_request(b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}')
    enc = events_module.StreamEncoder(model="m", request=req)
    return enc.encode([StreamStart("id-1", "m"), TextDelta(text), StreamFinish("stop"), UsageUpdate(2, 3),
                       StreamEnd()])


@pytest.mark.parametrize("upstream", [gemini, anthropic])
@pytest.mark.parametrize("step", [1, 5, 4096])
def test_stream_sniffed_and_decoded_however_split(upstream, step: int) -> None:
    wire = _stream(upstream, "streamed words")
    dec = vertex.StreamDecoder()
    events = []
    for i in range(0, len(wire), step):
        events += dec.feed(wire[i:i + step])
    events += dec.close()
    assert "".join(e.text for e in events if type(e) is TextDelta) == "streamed words"
    assert type(events[-1]) is StreamEnd


def test_recorded_streams_reach_an_openai_client() -> None:
    from tests.adapters.conformance.recorded import RECORDED, sse_from_chunks

    for name, upstream, word in (("vai-google-text.chunks.txt", "gemini", b"strawberry"),
                                 ("vai-anthropic-text.chunks.txt", "anthropic", b"content")):
        wire = sse_from_chunks(upstream, RECORDED[name])
        req = openai.parse_request(b'{"model":"m","stream":true,"messages":[{"role":"user","content":"x"}]}')
        tr = translate_stream("vertex", "openai", req)
        out = b"".join(tr.feed(wire[i:i + 37]) for i in range(0, len(wire), 37)) + tr.finish()
        assert tr.finished and tr.error is None and word in out and out.endswith(b"data: [DONE]\n\n")


def test_an_empty_stream_is_a_cut_not_a_hang() -> None:
    dec = vertex.StreamDecoder()
    assert dec.feed(b"\n") == []
    assert type(dec.close()[-1]) is StreamError
