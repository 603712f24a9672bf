"""A Chat Completions response read into a `ChatResponse` and rendered from one."""

from __future__ import annotations

import time
import uuid

import orjson

from adapters.call_ids import with_signature
from adapters.fields import bad_upstream, load_object
from adapters.internal import ChatRequest, ChatResponse, ReasoningPart, ToolCall, Usage
from adapters.openai.render import _call
from adapters.openai.usage import read_usage, render_usage
from adapters.openai.wire import _FINISH_IN, _FINISH_OUT, ChatCompletion, ResponseMessageOut
from adapters.reasoning import reasoning_text

# Where OpenAI-compatible servers put reasoning text: `reasoning_content` (DeepSeek, SGLang, older
# vLLM), `reasoning` (newer vLLM, OpenRouter).
REASONING_FIELDS = ("reasoning_content", "reasoning")
from contracts.errors import ClientError


def parse_response(body: bytes) -> ChatResponse:
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    choices = obj.get("choices")
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        raise bad_upstream("no choices")
    msg = choices[0].get("message")
    if type(msg) is not dict:
        raise bad_upstream("choices[0].message missing")
    content = msg.get("content")
    if type(content) is list:  # some servers answer with parts
        content = "".join(p.get("text", "") for p in content if type(p) is dict and type(p.get("text")) is str)
    elif type(content) is not str:
        content = ""
    refusal = msg.get("refusal")
    refusal = refusal if type(refusal) is str and refusal else None
    tcs = []
    raw_tcs = msg.get("tool_calls")
    if type(raw_tcs) is list:
        for j, tc in enumerate(raw_tcs):
            fn = tc.get("function") if type(tc) is dict else None
            if type(fn) is not dict or type(fn.get("name")) is not str:
                raise bad_upstream(f"tool_calls[{j}] malformed")
            args = fn.get("arguments")
            tid = tc.get("id")
            tcs.append(ToolCall(tid if type(tid) is str else f"call_{j}", fn["name"], args if type(args) is str else ""))
    fr = choices[0].get("finish_reason")
    reason = _FINISH_IN.get(fr, "stop") if type(fr) is str else ("tool_calls" if tcs else "stop")
    if refusal is not None and reason == "stop":
        reason = "content_filter"  # a refusal ends the turn as a refusal, not an answer
    usage = obj.get("usage")
    u = Usage()
    if type(usage) is dict:
        u = read_usage(usage)
    rid, model = obj.get("id"), obj.get("model")
    thought = next((t for k in REASONING_FIELDS if type(t := msg.get(k)) is str and t), None)
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", content,
                        tuple(tcs), reason, u, refusal, reasoning=(ReasoningPart(thought),) if thought else ())


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    empty = not resp.content and (resp.tool_calls or resp.refusal)
    msg: ResponseMessageOut = {"role": "assistant", "content": None if empty else resp.content, "refusal": resp.refusal}
    if thought := reasoning_text(resp.reasoning):
        msg["reasoning_content"] = thought
    if resp.tool_calls:
        # A Gemini thought signature rides in the id, which the client hands back next turn.
        msg["tool_calls"] = [_call(tc, with_signature(tc.id, tc.signature)) for tc in resp.tool_calls]
    u = resp.usage
    out: ChatCompletion = {
        "id": resp.id or "chatcmpl-" + uuid.uuid4().hex,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": msg, "finish_reason": _FINISH_OUT[resp.finish_reason], "logprobs": None}],
        "usage": render_usage(u),
    }
    return orjson.dumps(out)
