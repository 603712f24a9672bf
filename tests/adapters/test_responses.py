"""Response translation (non-streaming): upstream body -> internal -> client body, every pair."""

from __future__ import annotations

import re

import orjson
import pytest

from adapters import anthropic, gemini, openai
from adapters.internal import CacheTokens, ChatResponse, ToolCall, Usage
from adapters.registry import PROTOCOLS
from contracts.errors import UpstreamError
from tests.adapters.fixtures import RESPONSE_MEANING, RESPONSES, body
from tests.adapters.translation_checks import NAMES, meaning

KINDS = ["text", "tool", "length"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("upstream", NAMES)
def test_parse_response_golden(upstream: str, kind: str) -> None:
    resp = PROTOCOLS[upstream].parse_response(body(RESPONSES[upstream][kind]))
    assert meaning(resp) == RESPONSE_MEANING[kind]
    assert resp.id and resp.model.endswith("-up")
    if kind == "tool":
        tid = resp.tool_calls[0].id
        if upstream == "gemini":  # Gemini sends no id: one derived from its responseId, so unique per turn
            assert re.fullmatch(r"call_[0-9a-f]{16}_0", tid)
        else:
            assert tid == "call_0"


def test_render_response_golden_shapes() -> None:
    resp = ChatResponse("id-1", "up", "Hi", (ToolCall("call_9", "f", '{"a":1}'),), "tool_calls", Usage(3, 4))
    oa = orjson.loads(openai.render_response(resp, model="m"))
    del oa["created"]
    assert oa == {"id": "id-1", "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
            "role": "assistant", "content": "Hi", "refusal": None, "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}
    assert orjson.loads(anthropic.render_response(resp, model="m")) == {
        "id": "id-1", "type": "message", "role": "assistant", "model": "m", "content": [
            {"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "call_9", "name": "f", "input": {"a": 1}}],
        "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 4}}
    assert orjson.loads(gemini.render_response(resp, model="m")) == {
        "candidates": [{"content": {"role": "model", "parts": [{"text": "Hi"}, {"functionCall": {
            "name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 4, "totalTokenCount": 7},
        "modelVersion": "m", "responseId": "id-1"}


def test_finish_reason_vocabularies() -> None:
    def an(sr: str) -> str:
        return anthropic.parse_response(body({"content": [], "stop_reason": sr})).finish_reason

    assert [an(s) for s in ("end_turn", "stop_sequence", "max_tokens", "tool_use", "refusal")] == \
        ["stop", "stop", "length", "tool_calls", "content_filter"]

    def gm(fr: str) -> str:
        return gemini.parse_response(body({"candidates": [{"content": {"parts": [{"text": "x"}]},
                                                            "finishReason": fr}]})).finish_reason

    assert [gm(s) for s in ("STOP", "MAX_TOKENS", "SAFETY", "RECITATION")] == \
        ["stop", "length", "content_filter", "content_filter"]
    blocked = gemini.parse_response(body({"promptFeedback": {"blockReason": "SAFETY"}}))
    assert blocked.finish_reason == "content_filter" and blocked.content == ""
    cached = anthropic.parse_response(body({"content": [], "usage": {
        "input_tokens": 1, "cache_read_input_tokens": 10, "output_tokens": 2}}))
    assert cached.usage == Usage(11, 2, CacheTokens(read=10))  # input counts the cache read, kept apart too


@pytest.mark.parametrize("proto", NAMES)
@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b"null", b'{"choices":[]}', b'{"content":"x"}',
                                 b'{"candidates":[1]}', b'{"choices":[{"message":{"tool_calls":[1]}}]}'], ids=[
    "empty", "truncated", "array", "null", "no-choices", "content-string", "candidate-number", "tool-call-number"
])
def test_bad_upstream_responses_are_502(proto: str, raw: bytes) -> None:
    with pytest.raises(UpstreamError) as ei:
        PROTOCOLS[proto].parse_response(raw)
    assert ei.value.status == 502
