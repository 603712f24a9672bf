"""A Responses API `response` object read into a `ChatResponse` and rendered from one."""

from __future__ import annotations

import time
import uuid

import orjson

from adapters.call_ids import with_signature
from adapters.fields import bad_upstream, load_object
from adapters.internal import ChatRequest, ChatResponse, FinishReason, ReasoningPart, ToolCall, Usage
from adapters.json_types import JSONObject
from adapters.responses.render import _text_config, _tool_choice_out, _tool_defs
from adapters.responses.usage import read_usage, render_usage
from adapters.responses.wire import (
    OutputCall,
    OutputItem,
    OutputMessage,
    OutputPart,
    OutputReasoning,
    ResponseObject,
)
from contracts.errors import ClientError


def _incomplete_reason(reason: FinishReason) -> str | None:
    return {"length": "max_output_tokens", "content_filter": "content_filter"}.get(reason)


def _part(kind: str, text: str) -> OutputPart:
    if kind == "refusal":
        return {"type": "refusal", "refusal": text}
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, parts: list[OutputPart], status: str) -> OutputMessage:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": parts}


def _call_item(item_id: str, tc: ToolCall, status: str) -> OutputCall:
    # A Gemini thought signature rides in the call id; a call without arguments is "{}", as OpenAI sends it.
    return {"type": "function_call", "id": item_id, "call_id": with_signature(tc.id, tc.signature),
            "name": tc.name, "arguments": tc.arguments or "{}", "status": status}


def _reasoning_item(item_id: str, part: ReasoningPart) -> OutputReasoning:
    # Another protocol's signature (Anthropic's, Gemini's) is the item's opaque state, as OpenAI's is.
    item: OutputReasoning = {"type": "reasoning", "id": item_id,
                             "summary": [{"type": "summary_text", "text": part.text}] if part.text else []}
    if part.signature:
        item["encrypted_content"] = part.signature
    return item


def reasoning_part(item: JSONObject) -> ReasoningPart:
    """A reasoning output item as a reasoning part: its summaries (or reasoning text) and encrypted state."""
    texts: list[str] = []
    for key in ("summary", "content"):
        parts = item.get(key)
        texts += [p["text"] for p in parts if type(p) is dict and type(p.get("text")) is str and p["text"]] \
            if type(parts) is list else []
        if texts:
            break  # the summary when there is one; the raw reasoning text otherwise
    enc = item.get("encrypted_content")
    return ReasoningPart("\n\n".join(texts), enc if type(enc) is str and enc else None)


def _response_object(rid: str, created: int, model: str, output: list[OutputItem], status: str,
                     reason: FinishReason | None, usage: Usage | None, req: ChatRequest | None,
                     error: str | None = None) -> ResponseObject:
    """The `response` object, as answered whole and as carried by the stream's lifecycle events."""
    incomplete = _incomplete_reason(reason) if reason is not None and status == "incomplete" else None
    return {
        "id": rid, "object": "response", "created_at": created, "status": status,
        "error": {"code": "server_error", "message": error} if error is not None else None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": req.system if req else None,
        "max_output_tokens": req.max_tokens if req else None,
        "model": model, "output": output, "previous_response_id": None,
        "parallel_tool_calls": req.parallel_tool_calls is not False if req else True,
        "reasoning": {"effort": None, "summary": None}, "store": False,
        "temperature": req.temperature if req else None,
        "text": _text_config(req.response_format if req else None),
        "tool_choice": _tool_choice_out(req.tool_choice if req else None),
        "tools": _tool_defs(req.tools) if req else [],
        "top_p": req.top_p if req else None, "truncation": "disabled",
        "usage": render_usage(usage) if usage is not None else None, "user": None, "metadata": {},
    }


def _status(reason: FinishReason, refused: bool = False) -> str:
    if reason == "error":
        return "failed"
    if refused and reason == "content_filter":
        return "completed"  # OpenAI answers a refusal as a completed response with a refusal part
    return "incomplete" if _incomplete_reason(reason) else "completed"


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    status = _status(resp.finish_reason, resp.refusal is not None)
    item_status = "incomplete" if status == "incomplete" else "completed"
    # One random draw per response; item ids add their output index (unique, and cheap).
    base = uuid.uuid4().hex
    output: list[OutputItem] = [_reasoning_item(f"rs_{base}_{j}", p) for j, p in enumerate(resp.reasoning)]
    if resp.content or resp.refusal or not resp.tool_calls:
        parts = [_part("output_text", resp.content)] if resp.content or not resp.refusal else []
        if resp.refusal:
            parts.append(_part("refusal", resp.refusal))
        output.append(_message_item(f"msg_{base}_{len(output)}", parts, item_status))
    for tc in resp.tool_calls:
        output.append(_call_item(f"fc_{base}_{len(output)}", tc, item_status))
    error = "the model stopped with an error" if status == "failed" else None
    return orjson.dumps(_response_object("resp_" + base, int(time.time()), model, output, status,
                                         resp.finish_reason, resp.usage, request, error))


def _reason_of(obj: JSONObject, has_calls: bool) -> FinishReason:
    status = obj.get("status")
    if status == "failed":
        return "error"
    if status == "incomplete":
        details = obj.get("incomplete_details")
        why = details.get("reason") if type(details) is dict else None
        return "content_filter" if why == "content_filter" else "length"
    return "tool_calls" if has_calls else "stop"


# -- an upstream's answer ------------------------------------------------------------------------
# Output items the internal format carries (a reasoning item as a reasoning part).
_CARRIED = frozenset(("message", "function_call", "reasoning"))
_PARTS = frozenset(("output_text", "refusal"))


def untranslatable(what: str) -> str:
    """The caller's error for an answer its protocol cannot express (never dropped silently)."""
    return (f"the upstream answered with {what}, which this API cannot express; "
            "call this model through POST /v1/responses to receive it")


def item_problem(item: JSONObject) -> str | None:
    """Why an output item cannot be translated, or None when the internal format carries it."""
    t = item.get("type")
    if type(t) is not str:
        return "an output item of unknown type"
    return None if t in _CARRIED else f"a {t} output item"


def part_problem(part: object) -> str | None:
    t = part.get("type") if type(part) is dict else None
    if type(t) is not str:
        return "a malformed message part"
    return None if t in _PARTS else f"a message part of type {t}"


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    output = obj.get("output")
    if type(output) is not list:
        raise bad_upstream("no output")
    text: list[str] = []
    refusal: list[str] = []
    calls: list[ToolCall] = []
    reasoning: list[ReasoningPart] = []
    problem: str | None = None
    for j, item in enumerate(output):
        if type(item) is not dict:
            raise bad_upstream(f"output[{j}] is not an object")
        problem = problem or item_problem(item)
        if item.get("type") == "message":
            content = item.get("content")
            for c in content if type(content) is list else ():
                problem = problem or part_problem(c)
                if type(c) is dict and c.get("type") == "output_text" and type(c.get("text")) is str:
                    text.append(c["text"])
                elif type(c) is dict and c.get("type") == "refusal" and type(c.get("refusal")) is str:
                    refusal.append(c["refusal"])
        elif item.get("type") == "function_call":
            cid, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if type(cid) is not str or type(name) is not str:
                raise bad_upstream(f"output[{j}] function_call malformed")
            calls.append(ToolCall(cid, name, args if type(args) is str else ""))
        elif item.get("type") == "reasoning" and ((part := reasoning_part(item)).text or part.signature):
            reasoning.append(part)
    rid, model = obj.get("id"), obj.get("model")
    reason = _reason_of(obj, bool(calls))
    if refusal and reason == "stop":
        reason = "content_filter"  # a refusal ends the turn as a refusal, as the OpenAI adapter reads it
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", "".join(text),
                        tuple(calls), reason, read_usage(obj.get("usage"), output), "".join(refusal) or None,
                        untranslatable(problem) if problem else None, tuple(reasoning))
