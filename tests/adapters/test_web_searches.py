"""Web searches a provider ran as a tool and bills apart from tokens, read from its answer: Anthropic's
web_search server tool (`usage.server_tool_use.web_search_requests`), Gemini's
grounding queries (`groundingMetadata.webSearchQueries`, on the candidate or the streamed chunk that
carries it) and the Responses API's `web_search_call` items, whole and streamed. The shapes are the
ones the providers' API references document (docs.anthropic.com "Web search tool"; ai.google.dev
generateContent "GroundingMetadata"; platform.openai.com Responses "web_search_call" output item)."""

from __future__ import annotations

from typing import Any

import orjson

from adapters import anthropic, gemini, responses
from adapters.registry import PROTOCOLS
from adapters.stream_usage import StreamUsage

GROUNDED: dict[str, Any] = {
    "candidates": [{
        "content": {"role": "model", "parts": [{"text": "Spain won Euro 2024."}]}, "finishReason": "STOP",
        "groundingMetadata": {"webSearchQueries": ["euro 2024 winner", "euro 2024 final score"],
                              "searchEntryPoint": {"renderedContent": "<div></div>"},
                              "groundingChunks": [{"web": {"uri": "https://example.org", "title": "example.org"}}]}}],
    "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19},
    "modelVersion": "gemini-3-pro"}


def test_a_grounded_gemini_answer_reports_its_queries() -> None:
    usage = gemini.parse_response(orjson.dumps(GROUNDED)).usage
    assert (usage.input_tokens, usage.output_tokens, usage.web_searches) == (12, 7, 2)
    plain = {**GROUNDED, "candidates": [{k: v for k, v in GROUNDED["candidates"][0].items() if k != "groundingMetadata"}]}
    assert gemini.parse_response(orjson.dumps(plain)).usage.web_searches == 0


def test_a_grounded_gemini_stream_reports_its_queries_on_the_chunk_that_carries_them() -> None:
    first = {"candidates": [{"content": {"role": "model", "parts": [{"text": "Spain "}]}}],
             "usageMetadata": {"promptTokenCount": 12}}
    last = {**GROUNDED, "candidates": [{**GROUNDED["candidates"][0], "content": {"role": "model",
                                                                                  "parts": [{"text": "won."}]}}]}
    raw = b"".join(b"data: " + orjson.dumps(c) + b"\r\n\r\n" for c in (first, last))
    meter = StreamUsage()
    decoder = PROTOCOLS["gemini"].StreamDecoder()
    meter.observe(decoder.feed(raw[:40]) + decoder.feed(raw[40:]) + decoder.close())
    assert (meter.reported.web_searches, meter.partial(0).web_searches) == (2, 2)


def test_responses_web_search_calls_are_counted_whole_and_streamed() -> None:
    answer: dict[str, Any] = {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5", "output": [
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "a"}},
        {"type": "web_search_call", "id": "ws_2", "status": "completed", "action": {"type": "search", "query": "b"}},
        {"type": "message", "id": "m", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "found", "annotations": []}]}],
        "usage": {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}}
    assert responses.parse_response(orjson.dumps(answer)).usage.web_searches == 2
    events: list[dict[str, Any]] = [{"type": "response.created", "response": {**answer, "status": "in_progress", "output": [],
                                                         "usage": None}},
              {"type": "response.completed", "response": answer}]
    raw = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)
    meter = StreamUsage()
    decoder = PROTOCOLS["responses"].StreamDecoder()
    meter.observe(decoder.feed(raw) + decoder.close())
    assert (meter.reported.input_tokens, meter.reported.web_searches) == (9, 2)


def test_anthropic_server_tools_are_for_an_anthropic_deployment_and_their_searches_are_counted() -> None:
    ask = {"model": "m", "max_tokens": 64, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
           "messages": [{"role": "user", "content": "who won"},
                        {"role": "assistant", "content": [
                            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}},
                            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                            {"type": "text", "text": "Spain."}]},
                        {"role": "user", "content": "and before?"}]}
    req = anthropic.parse_request(orjson.dumps(ask))
    assert req.tools == () and req.native_only == ("messages[1].content[0].server_tool_use, "
                                                   "messages[1].content[1].web_search_tool_result, tools[0].web_search_20250305")
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude", "stop_reason": "end_turn",
              "content": [{"type": "text", "text": "Spain."}],
              "usage": {"input_tokens": 20, "output_tokens": 5, "server_tool_use": {"web_search_requests": 3}}}
    assert anthropic.parse_response(orjson.dumps(answer)).usage.web_searches == 3
    events = [("message_start", {"type": "message_start", "message": {**answer, "content": [],
                                                                      "usage": {"input_tokens": 20, "output_tokens": 1}}}),
              ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                                 "usage": {"output_tokens": 5, "server_tool_use": {"web_search_requests": 3}}}),
              ("message_stop", {"type": "message_stop"})]
    raw = b"".join(b"event: " + name.encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for name, e in events)
    meter = StreamUsage()
    decoder = PROTOCOLS["anthropic"].StreamDecoder()
    meter.observe(decoder.feed(raw) + decoder.close())
    assert (meter.reported.output_tokens, meter.reported.web_searches) == (5, 3)
