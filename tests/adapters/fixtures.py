"""One conversation in every protocol, and upstream responses / streams in every protocol."""

from __future__ import annotations

import dataclasses

import orjson

from adapters.internal import ChatRequest, ImagePart, Message, TextPart, ToolCall, ToolChoice, ToolDef

PNG = "iVBORw0KGgo="
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}

OPENAI_REQUEST = {
    "model": "chat-model",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [
            {"type": "text", "text": "What is the weather in Paris?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21C"},
        {"role": "user", "content": "Thanks! And tomorrow?"},
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                                "parameters": SCHEMA}}],
    "tool_choice": "auto",
    "temperature": 0.5,
    "top_p": 0.9,
    "max_tokens": 100,
    "stop": ["END"],
}

ANTHROPIC_REQUEST = {
    "model": "chat-model",
    "max_tokens": 100,
    "system": "You are terse.",
    "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": "What is the weather in Paris?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
        ]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "call_0", "name": "get_weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_0", "content": "sunny, 21C"},
            {"type": "text", "text": "Thanks! And tomorrow?"},
        ]},
    ],
    "tools": [{"name": "get_weather", "description": "Weather by city", "input_schema": SCHEMA}],
    "tool_choice": {"type": "auto"},
    "temperature": 0.5,
    "top_p": 0.9,
    "stop_sequences": ["END"],
}

GEMINI_REQUEST = {
    "systemInstruction": {"parts": [{"text": "You are terse."}]},
    "contents": [
        {"role": "user", "parts": [{"text": "What is the weather in Paris?"},
                                   {"inlineData": {"mimeType": "image/png", "data": PNG}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"content": "sunny, 21C"}}}]},
        {"role": "user", "parts": [{"text": "Thanks! And tomorrow?"}]},
    ],
    "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather by city",
                                         "parameters": SCHEMA}]}],
    "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
    "generationConfig": {"temperature": 0.5, "topP": 0.9, "maxOutputTokens": 100, "stopSequences": ["END"]},
}

REQUESTS = {"openai": OPENAI_REQUEST, "anthropic": ANTHROPIC_REQUEST, "gemini": GEMINI_REQUEST}

# What every one of the three parses to (names/flags that differ per protocol are canonicalised away).
CANONICAL = ChatRequest(
    model="chat-model",
    system="You are terse.",
    messages=(
        Message("user", (TextPart("What is the weather in Paris?"), ImagePart(media_type="image/png", data=PNG))),
        Message("assistant", (), (ToolCall("call_0", "get_weather", '{"city":"Paris"}'),)),
        Message("tool", (TextPart("sunny, 21C"),), tool_call_id="call_0"),
        Message("user", (TextPart("Thanks! And tomorrow?"),)),
    ),
    tools=(ToolDef("get_weather", "Weather by city", SCHEMA),),
    tool_choice=ToolChoice("auto"),
    temperature=0.5,
    top_p=0.9,
    max_tokens=100,
    stop=("END",),
)


def body(obj: dict) -> bytes:
    return orjson.dumps(obj)


# ---- upstream responses (plain) ------------------------------------------------------------

RESPONSES = {
    "openai": {
        "text": {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-up",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                              "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}},
        "tool": {"id": "chatcmpl-2", "object": "chat.completion", "created": 1, "model": "gpt-up",
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "call_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
                              "finish_reason": "tool_calls"}],
                 "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}},
        "length": {"id": "chatcmpl-3", "object": "chat.completion", "created": 1, "model": "gpt-up",
                   "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hel"},
                                "finish_reason": "length"}],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}},
    },
    "anthropic": {
        "text": {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-up",
                 "content": [{"type": "text", "text": "Hello there"}], "stop_reason": "end_turn",
                 "stop_sequence": None, "usage": {"input_tokens": 11, "output_tokens": 2}},
        "tool": {"id": "msg_2", "type": "message", "role": "assistant", "model": "claude-up",
                 "content": [{"type": "tool_use", "id": "call_0", "name": "get_weather", "input": {"city": "Paris"}}],
                 "stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 20, "output_tokens": 7}},
        "length": {"id": "msg_3", "type": "message", "role": "assistant", "model": "claude-up",
                   "content": [{"type": "text", "text": "Hel"}], "stop_reason": "max_tokens",
                   "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1}},
    },
    "gemini": {
        "text": {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello there"}]},
                                 "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": 11, "candidatesTokenCount": 2, "totalTokenCount": 13},
                 "modelVersion": "gemini-up", "responseId": "resp-1"},
        "tool": {"candidates": [{"content": {"role": "model", "parts": [
                     {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
                                 "finishReason": "STOP", "index": 0}],
                 "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 7, "totalTokenCount": 27},
                 "modelVersion": "gemini-up", "responseId": "resp-2"},
        "length": {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]},
                                   "finishReason": "MAX_TOKENS", "index": 0}],
                   "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 1, "totalTokenCount": 6},
                   "modelVersion": "gemini-up", "responseId": "resp-3"},
    },
}


# The Responses API as an upstream, shaped as OpenAI answers (a hidden reasoning item before the call,
# as its reasoning models send one; it carries no text, so it translates to nothing). No recorded
# Responses exchange is in /work/shared/fixtures/recorded-streams (its SOURCES.md lists chat streams
# only): these follow OpenAI's API reference for the `response` object and its streaming events.
def _rs(rid: str, status: str, output: list, usage: tuple[int, int] | None, **extra: object) -> dict:
    return {"id": rid, "object": "response", "created_at": 1741476542, "status": status, "background": False,
            "error": None, "incomplete_details": None, "instructions": None, "max_output_tokens": None,
            "model": "gpt-up-2025-04-14", "output": output, "parallel_tool_calls": True,
            "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "service_tier": "default",
            "store": False, "temperature": 1.0, "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto", "tools": [], "top_p": 1.0, "truncation": "disabled",
            "usage": None if usage is None else {
                "input_tokens": usage[0], "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": usage[1], "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": sum(usage)},
            "user": None, "metadata": {}, **extra}


def _rs_msg(iid: str, text: str, status: str = "completed") -> dict:
    return {"id": iid, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}]}


_RS_REASONING = {"id": "rs_68af0001", "type": "reasoning", "summary": []}
_RS_CALL = {"id": "fc_68af0002", "type": "function_call", "status": "completed", "arguments": '{"city":"Paris"}',
            "call_id": "call_0", "name": "get_weather"}
RESPONSES["responses"] = {
    "text": _rs("resp_1", "completed", [_rs_msg("msg_1", "Hello there")], (11, 2)),
    "tool": _rs("resp_2", "completed", [_RS_REASONING, _RS_CALL], (20, 7)),
    "length": _rs("resp_3", "incomplete", [_rs_msg("msg_3", "Hel", "incomplete")], (5, 1),
                  incomplete_details={"reason": "max_output_tokens"}),
}

# (content, [(name, args)], finish, input, output) every protocol's response above means
RESPONSE_MEANING = {
    "text": ("Hello there", [], "stop", 11, 2),
    "tool": ("", [("get_weather", {"city": "Paris"})], "tool_calls", 20, 7),
    "length": ("Hel", [], "length", 5, 1),
}


# ---- upstream streams ----------------------------------------------------------------------


def _sse(objs: list, events: list[str] | None = None, sep: bytes = b"\n\n") -> bytes:
    out = b""
    for i, o in enumerate(objs):
        data = o if isinstance(o, bytes) else orjson.dumps(o)
        if events:
            out += b"event: " + events[i].encode() + b"\n"
        out += b"data: " + data + sep
    return out


def _oa_chunk(delta: dict, finish: str | None = None, **extra: object) -> dict:
    return {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "gpt-up",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


_OA_USAGE = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "gpt-up", "choices": [],
             "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}}

OPENAI_STREAM_TEXT = _sse([
    _oa_chunk({"role": "assistant", "content": ""}), _oa_chunk({"content": "Hello"}), _oa_chunk({"content": " there"}),
    _oa_chunk({}, "stop"), _OA_USAGE, b"[DONE]",
])
OPENAI_STREAM_TOOL = _sse([
    _oa_chunk({"role": "assistant", "content": None}),
    _oa_chunk({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
                               "function": {"name": "get_weather", "arguments": ""}}]}),
    _oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    _oa_chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    _oa_chunk({}, "tool_calls"),
    {**_OA_USAGE, "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}}, b"[DONE]",
])


def _an(t: str, **kw: object) -> dict:
    return {"type": t, **kw}


_AN_START = _an("message_start", message={"id": "msg_s", "type": "message", "role": "assistant", "model": "claude-up",
                                          "content": [], "stop_reason": None, "stop_sequence": None,
                                          "usage": {"input_tokens": 11, "output_tokens": 1}})
ANTHROPIC_STREAM_TEXT = _sse(
    [_AN_START, _an("content_block_start", index=0, content_block={"type": "text", "text": ""}), _an("ping"),
     _an("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
     _an("content_block_delta", index=0, delta={"type": "text_delta", "text": " there"}),
     _an("content_block_stop", index=0),
     _an("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None}, usage={"output_tokens": 2}),
     _an("message_stop")],
    ["message_start", "content_block_start", "ping", "content_block_delta", "content_block_delta",
     "content_block_stop", "message_delta", "message_stop"],
)
ANTHROPIC_STREAM_TOOL = _sse(
    [{**_AN_START, "message": {**_AN_START["message"], "usage": {"input_tokens": 20, "output_tokens": 1}}},
     _an("content_block_start", index=0, content_block={"type": "tool_use", "id": "call_0", "name": "get_weather",
                                                        "input": {}}),
     _an("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '{"city":'}),
     _an("content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": '"Paris"}'}),
     _an("content_block_stop", index=0),
     _an("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 7}),
     _an("message_stop")],
    ["message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
     "message_delta", "message_stop"],
)


def _gm(parts: list, finish: str | None = None, usage: tuple[int, int] | None = None) -> dict:
    cand: dict = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    o: dict = {"candidates": [cand], "modelVersion": "gemini-up", "responseId": "resp-s"}
    if usage:
        o["usageMetadata"] = {"promptTokenCount": usage[0], "candidatesTokenCount": usage[1],
                              "totalTokenCount": sum(usage)}
    return o


GEMINI_STREAM_TEXT = _sse([_gm([{"text": "Hello"}], usage=(11, 1)), _gm([{"text": " there"}], "STOP", (11, 2))],
                          sep=b"\r\n\r\n")
GEMINI_STREAM_TOOL = _sse([_gm([{"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}], "STOP", (20, 7))],
                          sep=b"\r\n\r\n")


def _rs_events(events: list[dict]) -> bytes:
    """Responses SSE as OpenAI sends it: `event:` named after the type, sequence numbers from 0."""
    return _sse([{"type": e["type"], "sequence_number": n, **{k: v for k, v in e.items() if k != "type"}}
                 for n, e in enumerate(events)], [e["type"] for e in events])


def _rs_open(rid: str) -> list[dict]:
    snap = _rs(rid, "in_progress", [], None)
    return [{"type": "response.created", "response": snap}, {"type": "response.in_progress", "response": snap}]


_RS_PART = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
_RS_AT = {"item_id": "msg_s", "output_index": 0, "content_index": 0}
RESPONSES_STREAM_TEXT = _rs_events([
    *_rs_open("resp_s"),
    {"type": "response.output_item.added", "output_index": 0,
     "item": {"id": "msg_s", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}},
    {"type": "response.content_part.added", **_RS_AT, "part": _RS_PART},
    {"type": "response.output_text.delta", **_RS_AT, "delta": "Hello", "logprobs": [], "obfuscation": "q1Xz0"},
    {"type": "response.output_text.delta", **_RS_AT, "delta": " there", "logprobs": [], "obfuscation": "a9"},
    {"type": "response.output_text.done", **_RS_AT, "text": "Hello there", "logprobs": []},
    {"type": "response.content_part.done", **_RS_AT, "part": {**_RS_PART, "text": "Hello there"}},
    {"type": "response.output_item.done", "output_index": 0, "item": _rs_msg("msg_s", "Hello there")},
    {"type": "response.completed", "response": _rs("resp_s", "completed", [_rs_msg("msg_s", "Hello there")],
                                                   (11, 2))},
])
_RS_FC = {"item_id": "fc_68af0002", "output_index": 1}
RESPONSES_STREAM_TOOL = _rs_events([
    *_rs_open("resp_t"),
    {"type": "response.output_item.added", "output_index": 0, "item": _RS_REASONING},
    {"type": "response.output_item.done", "output_index": 0, "item": _RS_REASONING},
    {"type": "response.output_item.added", "output_index": 1,
     "item": {**_RS_CALL, "status": "in_progress", "arguments": ""}},
    {"type": "response.function_call_arguments.delta", **_RS_FC, "delta": '{"city":', "obfuscation": "x"},
    {"type": "response.function_call_arguments.delta", **_RS_FC, "delta": '"Paris"}', "obfuscation": "y"},
    {"type": "response.function_call_arguments.done", **_RS_FC, "arguments": '{"city":"Paris"}'},
    {"type": "response.output_item.done", "output_index": 1, "item": _RS_CALL},
    {"type": "response.completed", "response": _rs("resp_t", "completed", [_RS_REASONING, _RS_CALL], (20, 7))},
])

# (text, [(name, args)], finish, input, output, ended_cleanly) every protocol's stream above means
STREAM_MEANING = {
    "text": ("Hello there", [], "stop", 11, 2, True),
    "tool": ("", [("get_weather", {"city": "Paris"})], "tool_calls", 20, 7, True),
}

STREAMS = {
    "openai": {"text": OPENAI_STREAM_TEXT, "tool": OPENAI_STREAM_TOOL},
    "anthropic": {"text": ANTHROPIC_STREAM_TEXT, "tool": ANTHROPIC_STREAM_TOOL},
    "gemini": {"text": GEMINI_STREAM_TEXT, "tool": GEMINI_STREAM_TOOL},
    "responses": {"text": RESPONSES_STREAM_TEXT, "tool": RESPONSES_STREAM_TOOL},
}

# The Responses API has no stop sequences: a request with them is refused for a Responses upstream
# (tests/adapters/test_responses_upstream.py), so its golden requests are the conversation without.
_STOP_FIELDS = {"openai": ("stop",), "anthropic": ("stop_sequences",), "gemini": ("generationConfig", "stopSequences")}


def request_for(client: str, upstream: str) -> dict:
    """The client's golden request for this upstream: the canonical one, less what the upstream lacks."""
    req = orjson.loads(orjson.dumps(REQUESTS[client]))
    if upstream == "responses":
        *outer, key = _STOP_FIELDS[client]
        node = req
        for k in outer:
            node = node[k]
        del node[key]
    return req


def canonical_for(upstream: str) -> ChatRequest:
    return dataclasses.replace(CANONICAL, stop=()) if upstream == "responses" else CANONICAL


# ---- prompt-cache usage (the "cached" kind) -----------------------------------------------------
# One text answer with a prompt cache hit, in each upstream's own usage fields. The shapes follow the
# recorded streams in /work/shared/fixtures/recorded-streams (vai-anthropic-text.chunks.txt: Anthropic's
# cache_creation split and message_delta's cumulative counts; aig-cassette-chat-streaming-detailed-usage.sse:
# OpenAI's prompt_tokens_details), whose cache counts are all 0; the counts follow OpenAI's prompt
# caching guide (prompt_tokens 2006, cached_tokens 1920), spread over Anthropic's kinds so that every
# protocol means 2006 prompt tokens in all (Anthropic's input_tokens excludes reads and writes).
CACHED_IN, CACHED_OUT = 2006, 300
# (read, write, of which 1-hour) each upstream reports
CACHE_REPORTED = {"openai": (1920, 0, 0), "anthropic": (1920, 80, 50), "gemini": (1920, 0, 0),
                  "responses": (1920, 80, 0)}
_AN_CACHED_USAGE = {"input_tokens": 6, "cache_creation_input_tokens": 80, "cache_read_input_tokens": 1920,
                    "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 50}}


def cache_seen_by(client: str, reported: tuple[int, int, int]) -> tuple[int, int, int]:
    """What of the upstream's cache counts the client's protocol has fields for."""
    read, write, write_1h = reported
    return {"anthropic": reported, "bedrock": reported, "responses": (read, write, 0)}.get(client, (read, 0, 0))


RESPONSES["openai"]["cached"] = {**RESPONSES["openai"]["text"], "usage": {
    "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                  "rejected_prediction_tokens": 0}}}
RESPONSES["anthropic"]["cached"] = {**RESPONSES["anthropic"]["text"], "usage": {
    **_AN_CACHED_USAGE, "output_tokens": 300, "service_tier": "standard"}}
RESPONSES["gemini"]["cached"] = {**RESPONSES["gemini"]["text"], "usageMetadata": {
    "promptTokenCount": 2006, "candidatesTokenCount": 300, "totalTokenCount": 2306, "cachedContentTokenCount": 1920}}
_RS_CACHED_USAGE = {"input_tokens": 2006, "input_tokens_details": {"cached_tokens": 1920, "cache_write_tokens": 80},
                    "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 2306}
RESPONSES["responses"]["cached"] = {**RESPONSES["responses"]["text"], "usage": _RS_CACHED_USAGE}
RESPONSE_MEANING["cached"] = ("Hello there", [], "stop", CACHED_IN, CACHED_OUT)
STREAM_MEANING["cached"] = ("Hello there", [], "stop", CACHED_IN, CACHED_OUT, True)

STREAMS["openai"]["cached"] = _sse([
    _oa_chunk({"role": "assistant", "content": ""}), _oa_chunk({"content": "Hello"}), _oa_chunk({"content": " there"}),
    _oa_chunk({}, "stop"), {**_OA_USAGE, "usage": RESPONSES["openai"]["cached"]["usage"]}, b"[DONE]",
])
STREAMS["anthropic"]["cached"] = _sse(
    [{**_AN_START, "message": {**_AN_START["message"], "usage": {**_AN_CACHED_USAGE, "output_tokens": 1}}},
     _an("content_block_start", index=0, content_block={"type": "text", "text": ""}),
     _an("content_block_delta", index=0, delta={"type": "text_delta", "text": "Hello"}),
     _an("content_block_delta", index=0, delta={"type": "text_delta", "text": " there"}),
     _an("content_block_stop", index=0),
     _an("message_delta", delta={"stop_reason": "end_turn", "stop_sequence": None},
         usage={"input_tokens": 6, "cache_creation_input_tokens": 80, "cache_read_input_tokens": 1920,
                "output_tokens": 300}),
     _an("message_stop")],
    ["message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
     "message_delta", "message_stop"],
)
STREAMS["gemini"]["cached"] = _sse(
    [_gm([{"text": "Hello"}], usage=(2006, 1)),
     {**_gm([{"text": " there"}], "STOP"), "usageMetadata": RESPONSES["gemini"]["cached"]["usageMetadata"]}],
    sep=b"\r\n\r\n")
STREAMS["responses"]["cached"] = _rs_events([
    *_rs_open("resp_c"),
    {"type": "response.output_item.added", "output_index": 0,
     "item": {"id": "msg_s", "type": "message", "status": "in_progress", "content": [], "role": "assistant"}},
    {"type": "response.content_part.added", **_RS_AT, "part": _RS_PART},
    {"type": "response.output_text.delta", **_RS_AT, "delta": "Hello", "logprobs": []},
    {"type": "response.output_text.delta", **_RS_AT, "delta": " there", "logprobs": []},
    {"type": "response.output_text.done", **_RS_AT, "text": "Hello there", "logprobs": []},
    {"type": "response.content_part.done", **_RS_AT, "part": {**_RS_PART, "text": "Hello there"}},
    {"type": "response.output_item.done", "output_index": 0, "item": _rs_msg("msg_s", "Hello there")},
    {"type": "response.completed", "response": {
        **_rs("resp_c", "completed", [_rs_msg("msg_s", "Hello there")], None), "usage": _RS_CACHED_USAGE}},
])
