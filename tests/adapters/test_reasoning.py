"""Reasoning across protocols (issue 37): an OpenAI reasoning summary (with its encrypted state), an
Anthropic thinking block (and redacted_thinking) and a Gemini thought part reach every other
protocol's caller in that protocol's own home for them (chat `reasoning_content`, Anthropic
thinking blocks with the signature, Responses reasoning items with `encrypted_content`, Gemini
`thought: true` parts), whole and streamed, with the tool calls after them intact; a deployment's
`reasoning: drop` leaves them out. The streams are read by the official SDKs' parsers."""

from __future__ import annotations

import json

import orjson
import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from adapters import anthropic, gemini, openai, responses
from adapters.internal import (
    ChatRequest,
    ChatResponse,
    Message,
    ReasoningDelta,
    ReasoningPart,
    StreamError,
    TextPart,
    ToolCall,
)
from adapters.reasoning import drop_reasoning, reasoning_text, without_reasoning
from adapters.registry import PROTOCOLS, translate_stream
from adapters.sse import SSEFramer
from tests.adapters.conformance.recorded import RECORDED, sse_from_chunks
from tests.adapters.sdk_streams import anthropic_message, openai_completion
from tests.adapters.translation_checks import decode

RESPONSES_STREAM = sse_from_chunks("anthropic", RECORDED["openai-docs-responses-reasoning-summary-tools.chunks.txt"])
CLAUDE_STREAM = sse_from_chunks("anthropic", RECORDED["vai-anthropic-clear-thinking.1.chunks.txt"])
SUMMARY = ("**Checking the weather**\n\nThe user asks for Paris and Oslo; I should call get_weather for each."
           "\n\n**Planning the calls**\n\nTwo independent cities: two parallel calls.")
ENCRYPTED = "gAAAAABotfKk3Xq1-ENCRYPTED-REASONING-STATE-Zm9yIGRlbW8gb25seQ=="
CLAUDE_THOUGHT = "The previous result was 925. Now I need to divide that by 5.\n\n925 ÷ 5 = 185"
REQ = ChatRequest("m", (Message("user", (TextPart("weather in Paris and Oslo"),)),), stream=True)
EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)
# A Gemini stream with thought summaries (includeThoughts) and a signed call, per Google's thinking guide.
GEMINI_STREAM = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in [
    {"candidates": [{"content": {"role": "model", "parts": [{"text": "Weighing the cities", "thought": True}]}}],
     "responseId": "g1", "modelVersion": "gemini-2.5-pro"},
    {"candidates": [{"content": {"role": "model", "parts": [
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}, "thoughtSignature": "c2lnLWdlbWluaQ=="}]},
        "finishReason": "STOP"}],
     "usageMetadata": {"promptTokenCount": 9, "candidatesTokenCount": 5, "thoughtsTokenCount": 40}}])


def _chunked(raw: bytes, n: int = 37) -> list[bytes]:
    return [raw[i:i + n] for i in range(0, len(raw), n)]


def _through(upstream: str, client: str, raw: bytes, *, keep: bool = True) -> bytes:
    tr = translate_stream(upstream, client, REQ, keep_reasoning=keep)
    out = b"".join(tr.feed(c) for c in _chunked(raw)) + tr.finish()
    assert tr.error is None and tr.finished, tr.error
    return out


def _reasoning(events: list) -> tuple[str, list[str]]:
    evs = [e for e in events if isinstance(e, ReasoningDelta)]
    return "".join(e.text for e in evs), [e.signature for e in evs if e.signature]


# ---- decoders: each upstream's reasoning becomes ReasoningDelta events ------------------------


def test_the_responses_reasoning_stream_decodes_to_reasoning_then_both_calls() -> None:
    events = decode("responses", _chunked(RESPONSES_STREAM))
    assert not [e for e in events if isinstance(e, StreamError)]
    assert _reasoning(events) == (SUMMARY, [ENCRYPTED])
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ReasoningDelta") < kinds.index("ToolCallStart") and kinds[-1] == "StreamEnd"


def test_the_recorded_claude_thinking_stream_decodes_with_its_signature() -> None:
    text, sigs = _reasoning(decode("anthropic", _chunked(CLAUDE_STREAM)))
    assert text == CLAUDE_THOUGHT and len(sigs) == 1 and sigs[0].startswith("EvQBCkYICxgC")


def test_gemini_thought_parts_decode_as_reasoning_not_text() -> None:
    events = decode("gemini", [GEMINI_STREAM])
    assert _reasoning(events) == ("Weighing the cities", [])
    assert not [e for e in events if type(e).__name__ == "TextDelta"]


def test_openai_compatible_reasoning_content_decodes() -> None:
    chunks = [{"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]},
              {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"reasoning": " ok"}}]},
              {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}]
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    assert _reasoning(decode("openai", [raw])) == ("hmm ok", [])


# ---- encoders: every caller's SDK reads the whole stream, reasoning in its own home -------------


@pytest.mark.parametrize("upstream", ["responses", "anthropic", "gemini"])
def test_an_openai_chat_caller_gets_reasoning_content_and_the_calls(upstream: str) -> None:
    raw = {"responses": RESPONSES_STREAM, "anthropic": CLAUDE_STREAM, "gemini": GEMINI_STREAM}[upstream]
    chunks, snap = openai_completion(_through(upstream, "openai", raw))
    thought = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert thought == {"responses": SUMMARY, "anthropic": CLAUDE_THOUGHT, "gemini": "Weighing the cities"}[upstream]
    if upstream == "responses":
        calls = snap.choices[0].message.tool_calls  # type: ignore[attr-defined]
        assert [(c.id, json.loads(c.function.arguments)) for c in calls] == [
            ("call_Pw1", {"city": "Paris"}), ("call_Os2", {"city": "Oslo"})]
        assert snap.choices[0].finish_reason == "tool_calls"  # type: ignore[attr-defined]


def test_an_anthropic_caller_gets_a_thinking_block_signed_with_the_encrypted_content() -> None:
    msg = anthropic_message(_through("responses", "anthropic", RESPONSES_STREAM))
    assert [b.type for b in msg.content] == ["thinking", "tool_use", "tool_use"]
    assert msg.content[0].thinking == SUMMARY and msg.content[0].signature == ENCRYPTED  # type: ignore[union-attr]
    assert [b.input for b in msg.content[1:]] == [{"city": "Paris"}, {"city": "Oslo"}]  # type: ignore[union-attr]
    assert msg.stop_reason == "tool_use"


def test_a_responses_caller_gets_a_reasoning_item_from_claude_thinking() -> None:
    out = _through("anthropic", "responses", CLAUDE_STREAM)
    f = SSEFramer()
    evs = [EVENTS.validate_python(orjson.loads(e.data)) for e in f.feed(out) + f.close()]
    assert evs[-1].type == "response.completed"
    item = evs[-1].response.output[0]
    assert item.type == "reasoning" and item.summary[0].text == CLAUDE_THOUGHT
    assert item.encrypted_content is not None and item.encrypted_content.startswith("EvQBCkYICxgC")
    assert "response.reasoning_summary_text.delta" in [e.type for e in evs]


def test_a_gemini_caller_gets_thought_parts_from_claude_thinking() -> None:
    f = SSEFramer()
    out = [orjson.loads(e.data) for e in f.feed(_through("anthropic", "gemini", CLAUDE_STREAM)) + f.close()]
    parts = [p for c in out for p in c["candidates"][0]["content"]["parts"]]
    thoughts = [p for p in parts if p.get("thought")]
    assert "".join(p["text"] for p in thoughts) == CLAUDE_THOUGHT
    assert thoughts[-1]["thoughtSignature"].startswith("EvQBCkYICxgC")


def test_interleaved_thinking_after_a_tool_call_is_held_and_sent_in_order() -> None:
    from adapters.internal import StreamEnd, StreamFinish, StreamStart, ToolCallDelta, ToolCallStart
    enc = anthropic.StreamEncoder(model="m")
    raw = enc.encode([StreamStart("r", "m"), ToolCallStart(0, "t0", "f"), ReasoningDelta("then"),
                      ReasoningDelta("", "sig"), ToolCallDelta(0, '{"a":1}'), ReasoningDelta("", "red", redacted=True),
                      StreamFinish("tool_calls"), StreamEnd()])
    msg = anthropic_message(raw)
    assert [b.type for b in msg.content] == ["tool_use", "thinking", "redacted_thinking"]
    assert msg.content[1].signature == "sig" and msg.content[2].data == "red"  # type: ignore[union-attr]


def test_reasoning_drop_leaves_the_answer_whole() -> None:
    chunks, snap = openai_completion(_through("responses", "openai", RESPONSES_STREAM, keep=False))
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices)
    assert len(snap.choices[0].message.tool_calls) == 2  # type: ignore[attr-defined,arg-type]
    msg = anthropic_message(_through("responses", "anthropic", RESPONSES_STREAM, keep=False))
    assert [b.type for b in msg.content] == ["tool_use", "tool_use"]


# ---- whole answers -----------------------------------------------------------------------------


def _responses_answer() -> bytes:
    snap = orjson.loads(RECORDED["openai-docs-responses-reasoning-summary-tools.chunks.txt"].splitlines()[-1])
    Response.model_validate(snap["response"])
    return orjson.dumps(snap["response"])


def test_a_whole_responses_answer_with_reasoning_reads_and_renders_everywhere() -> None:
    resp = responses.parse_response(_responses_answer())
    assert resp.untranslatable is None and resp.reasoning == (ReasoningPart(SUMMARY, ENCRYPTED),)
    chat = orjson.loads(openai.render_response(resp, model="m"))["choices"][0]["message"]
    assert chat["reasoning_content"] == SUMMARY and len(chat["tool_calls"]) == 2
    claude = orjson.loads(anthropic.render_response(resp, model="m"))["content"]
    assert claude[0] == {"type": "thinking", "thinking": SUMMARY, "signature": ENCRYPTED}
    parts = orjson.loads(gemini.render_response(resp, model="m"))["candidates"][0]["content"]["parts"]
    assert parts[0] == {"text": SUMMARY, "thought": True, "thoughtSignature": ENCRYPTED}


@pytest.mark.parametrize("proto", ["openai", "anthropic", "gemini", "responses"])
def test_each_protocol_reads_back_the_reasoning_it_renders(proto: str) -> None:
    resp = ChatResponse("r", "m", "hi", (ToolCall("call_1", "f", '{"a":1}'),), "tool_calls",
                        reasoning=(ReasoningPart("step one", "sig-1"),))
    back = PROTOCOLS[proto].parse_response(PROTOCOLS[proto].render_response(resp, model="m"))
    want = ReasoningPart("step one", None if proto == "openai" else "sig-1")  # chat carries the text only
    assert back.reasoning == (want,) and back.content == "hi" and back.tool_calls[0].name == "f"


def test_redacted_thinking_round_trips_to_anthropic_and_is_left_out_where_it_has_no_home() -> None:
    body = orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "content": [
        {"type": "redacted_thinking", "data": "EmwKAhgBEgy"}, {"type": "text", "text": "ok"}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 3, "output_tokens": 2}})
    resp = anthropic.parse_response(body)
    assert resp.reasoning == (ReasoningPart("", "EmwKAhgBEgy", redacted=True),)
    assert orjson.loads(anthropic.render_response(resp, model="m"))["content"][0] == {
        "type": "redacted_thinking", "data": "EmwKAhgBEgy"}
    assert "reasoning_content" not in orjson.loads(openai.render_response(resp, model="m"))["choices"][0]["message"]
    assert orjson.loads(gemini.render_response(resp, model="m"))["candidates"][0]["content"]["parts"] == [{"text": "ok"}]


# ---- the pure policy ---------------------------------------------------------------------------


def test_the_policy_helpers() -> None:
    resp = ChatResponse("r", "m", "hi", reasoning=(ReasoningPart("a"), ReasoningPart("", "x", True), ReasoningPart("b")))
    assert without_reasoning(resp).reasoning == () and without_reasoning(without_reasoning(resp)) == without_reasoning(resp)
    assert reasoning_text(resp.reasoning) == "a\n\nb"
    assert drop_reasoning([ReasoningDelta("a"), StreamError("x")]) == [StreamError("x")]
