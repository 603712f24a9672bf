"""An Anthropic Messages response read into a `ChatResponse` and rendered from one."""

from __future__ import annotations

import uuid

import orjson

from adapters.anthropic.render import tool_id
from adapters.anthropic.usage import read_usage, render_usage
from adapters.anthropic.wire import (
    _FINISH_IN,
    _FINISH_OUT,
    JSON_TOOL,
    AnswerBlock,
    MessageResponse,
)
from adapters.call_ids import with_signature
from adapters.fields import arguments_object, bad_upstream, load_object, upstream_error
from adapters.internal import ChatRequest, ChatResponse, ReasoningPart, ToolCall, Usage
from contracts.errors import ClientError


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    content = obj.get("content")
    if type(content) is not list:
        raise bad_upstream("content is not an array")
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    structured = False
    for j, b in enumerate(content):
        if type(b) is not dict:
            raise bad_upstream(f"content[{j}] is not an object")
        t = b.get("type")
        if t == "text" and type(b.get("text")) is str:
            texts.append(b["text"])
        elif t == "thinking":
            thought, sig = b.get("thinking"), b.get("signature")
            reasoning.append(ReasoningPart(thought if type(thought) is str else "",
                                           sig if type(sig) is str and sig else None))
        elif t == "redacted_thinking" and type(b.get("data")) is str:
            reasoning.append(ReasoningPart("", b["data"], redacted=True))
        elif t == "tool_use":
            tid, name, inp = b.get("id"), b.get("name"), b.get("input")
            if type(name) is not str:
                raise bad_upstream(f"content[{j}].name missing")
            if name == JSON_TOOL:  # the structured answer we asked for as a forced tool
                texts.append(orjson.dumps(inp if type(inp) is dict else {}).decode())
                structured = True
                continue
            calls.append(ToolCall(tid if type(tid) is str else f"call_{len(calls)}", name,
                                  orjson.dumps(inp if type(inp) is dict else {}).decode()))
    sr = obj.get("stop_reason")
    reason = _FINISH_IN.get(sr, "stop") if type(sr) is str else ("tool_calls" if calls else "stop")
    if reason == "tool_calls" and structured and not calls:
        reason = "stop"  # only our structured-output tool was called: that is the answer
    u = obj.get("usage")
    usage = read_usage(u) if type(u) is dict else Usage()
    rid, model = obj.get("id"), obj.get("model")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(texts),
                        tuple(calls), reason, usage, reasoning=tuple(reasoning))


def reasoning_block(part: ReasoningPart) -> AnswerBlock:
    # Another protocol's opaque state (OpenAI's encrypted_content, Gemini's thoughtSignature) is the signature.
    if part.redacted and part.signature:
        return {"type": "redacted_thinking", "data": part.signature}
    return {"type": "thinking", "thinking": part.text, "signature": part.signature or ""}


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    content: list[AnswerBlock] = [reasoning_block(p) for p in resp.reasoning]
    text = resp.content or resp.refusal
    if text:
        content.append({"type": "text", "text": text})
    for tc in resp.tool_calls:
        content.append({"type": "tool_use", "id": tool_id(with_signature(tc.id, tc.signature)), "name": tc.name,
                        "input": arguments_object(tc.arguments, name=tc.name, error=upstream_error)})
    out: MessageResponse = {
        "id": resp.id or "msg_" + uuid.uuid4().hex,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _FINISH_OUT[resp.finish_reason],
        "stop_sequence": None,
        "usage": render_usage(resp.usage),
    }
    return orjson.dumps(out)
