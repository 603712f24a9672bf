"""A Gemini generateContent response read into a `ChatResponse` and rendered from one."""

from __future__ import annotations

import dataclasses
import uuid

import orjson

from adapters.call_ids import new_call_id
from adapters.fields import arguments_object, bad_upstream, load_object, upstream_error
from adapters.gemini.usage import read_usage, render_usage, web_searches
from adapters.gemini.wire import (
    _FINISH_IN,
    _FINISH_OUT,
    FunctionCallPart,
    GenerateContentResponse,
    PartOut,
    ThoughtPart,
)
from adapters.internal import ChatRequest, ChatResponse, FinishReason, ReasoningPart, ToolCall, Usage
from adapters.json_types import JSONArray, JSONObject
from contracts.errors import ClientError


def _candidate_parts(obj: JSONObject) -> tuple[JSONArray | None, str | None]:
    cands = obj.get("candidates")
    if type(cands) is not list or not cands or type(cands[0]) is not dict:
        return None, None
    c = cands[0]
    fr = c.get("finishReason")
    content = c.get("content")
    parts = content.get("parts") if type(content) is dict else None
    return (parts if type(parts) is list else []), (fr if type(fr) is str else None)


def _response_call(part: JSONObject, fc: JSONObject, response_id: str, ordinal: int) -> ToolCall:
    cid, args, sig = fc.get("id"), fc.get("args"), part.get("thoughtSignature")
    return ToolCall(cid if type(cid) is str and cid else new_call_id(response_id, ordinal), fc["name"],
                    orjson.dumps(args if type(args) is dict else {}).decode(), sig if type(sig) is str and sig else None)


def thought_part(p: JSONObject) -> ReasoningPart | None:
    """A thought summary part (`thought: true`) as a reasoning part, its thoughtSignature the signature."""
    if not p.get("thought"):
        return None
    text, sig = p.get("text"), p.get("thoughtSignature")
    return ReasoningPart(text if type(text) is str else "", sig if type(sig) is str and sig else None)


def reasoning_out(part: ReasoningPart) -> ThoughtPart | None:
    # Redacted reasoning (Anthropic's) has no Gemini part: it is left out, as a caller may omit it.
    if part.redacted:
        return None
    out: ThoughtPart = {"text": part.text, "thought": True}
    if part.signature:
        out["thoughtSignature"] = part.signature
    return out


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    parts, fr = _candidate_parts(obj)
    texts: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    rid = obj.get("responseId")
    reason: FinishReason
    if parts is None:
        pf = obj.get("promptFeedback")
        if not (type(pf) is dict and pf.get("blockReason")):
            raise bad_upstream("no candidates")
        reason = "content_filter"
    else:
        for j, p in enumerate(parts):
            if type(p) is not dict:
                raise bad_upstream(f"parts[{j}] is not an object")
            if (thought := thought_part(p)) is not None:
                reasoning.append(thought)
            elif type(p.get("text")) is str:
                texts.append(p["text"])
            fc = p.get("functionCall")
            if type(fc) is dict and type(fc.get("name")) is str:
                calls.append(_response_call(p, fc, rid if type(rid) is str else "", len(calls)))
        reason = _FINISH_IN.get(fr or "STOP", "stop")
        if reason == "stop" and calls:
            reason = "tool_calls"
    u = obj.get("usageMetadata")
    model = obj.get("modelVersion")
    usage = read_usage(u) if type(u) is dict else Usage()
    if searches := web_searches(obj):
        usage = dataclasses.replace(usage, web_searches=searches)
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(texts),
                        tuple(calls), reason, usage, reasoning=tuple(reasoning))


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    parts: list[PartOut] = [t for p in resp.reasoning if (t := reasoning_out(p)) is not None]
    text = resp.content or resp.refusal
    if text:
        parts.append({"text": text})
    for tc in resp.tool_calls:
        part: FunctionCallPart = {"functionCall": {"name": tc.name,
                                       "args": arguments_object(tc.arguments, name=tc.name, error=upstream_error)}}
        if tc.signature:
            part["thoughtSignature"] = tc.signature
        parts.append(part)
    if not parts:
        parts.append({"text": ""})
    out: GenerateContentResponse = {
        "candidates": [{"content": {"role": "model", "parts": parts},
                        "finishReason": _FINISH_OUT[resp.finish_reason], "index": 0}],
        "usageMetadata": render_usage(resp.usage),
        "modelVersion": model,
        "responseId": resp.id or uuid.uuid4().hex,
    }
    return orjson.dumps(out)
