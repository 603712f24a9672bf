"""Bedrock Converse answers <-> the internal response, and Bedrock's error shape (`{"message"}`)."""

from __future__ import annotations

import orjson

from adapters.bedrock.usage import read_usage, render_usage
from adapters.bedrock.wire import ContentBlock, ConverseResponse, StopReason
from adapters.fields import bad_upstream, load_object
from adapters.internal import ChatRequest, ChatResponse, FinishReason, ToolCall, Usage
from adapters.upstream_errors import provider_message, sanitize
from contracts.errors import ClientError

__all__ = ["FINISH_IN", "parse_response", "render_response", "render_error", "parse_error"]

FINISH_IN: dict[str, FinishReason] = {
    "end_turn": "stop", "stop_sequence": "stop", "tool_use": "tool_calls", "max_tokens": "length",
    "model_context_window_exceeded": "length", "guardrail_intervened": "content_filter",
    "content_filtered": "content_filter",
}
_FINISH_OUT: dict[FinishReason, StopReason] = {
    "stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "content_filter": "content_filtered",
    "error": "end_turn",
}


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    output = obj.get("output")
    msg = output.get("message") if type(output) is dict else None
    blocks = msg.get("content") if type(msg) is dict else None
    if type(blocks) is not list:
        raise bad_upstream("output.message.content missing")
    text: list[str] = []
    calls: list[ToolCall] = []
    for i, b in enumerate(blocks):
        if type(b) is not dict:
            raise bad_upstream(f"output.message.content[{i}] is not an object")
        if type(b.get("text")) is str:
            text.append(b["text"])
        elif type(b.get("toolUse")) is dict:
            tu = b["toolUse"]
            if type(tu.get("name")) is not str or type(tu.get("toolUseId")) is not str:
                raise bad_upstream(f"output.message.content[{i}].toolUse malformed")
            calls.append(ToolCall(tu["toolUseId"], tu["name"], orjson.dumps(tu.get("input") or {}).decode()))
        # reasoningContent and other blocks carry nothing a chat answer has a place for
    reason = obj.get("stopReason")
    finish = FINISH_IN.get(reason, "stop") if type(reason) is str else ("tool_calls" if calls else "stop")
    usage = obj.get("usage")
    u = Usage()
    if type(usage) is dict:
        u = read_usage(usage)
    return ChatResponse("", "", "".join(text), tuple(calls), finish, u)


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    """As Bedrock answers (the demo upstream's shape)."""
    blocks: list[ContentBlock] = [{"text": resp.content}] if resp.content else []
    blocks += [{"toolUse": {"toolUseId": tc.id, "name": tc.name, "input": orjson.loads(tc.arguments or "{}")}}
               for tc in resp.tool_calls]
    u = resp.usage
    out: ConverseResponse = {
        "output": {"message": {"role": "assistant", "content": blocks}},
        "stopReason": _FINISH_OUT[resp.finish_reason],
        "usage": render_usage(u),
        "metrics": {"latencyMs": 1},
    }
    return orjson.dumps(out)


def render_error(status: int, message: str, type: str | None = None) -> bytes:
    # Bedrock names the error's kind in the x-amzn-ErrorType header; the body holds the message only.
    return orjson.dumps({"message": message})


def parse_error(status: int, body: bytes) -> str:
    """The sanitized message: `message` (or `Message`, as some AWS errors spell it), or any
    provider's error object; never raw text."""
    found = provider_message(body)
    if found is None:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None
        msg = obj.get("Message") if type(obj) is dict else None
        found = sanitize(msg) if type(msg) is str else None
    return found or f"upstream returned HTTP {status}"
