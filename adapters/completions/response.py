"""A `text_completion` read into a `ChatResponse` and rendered from one."""

from __future__ import annotations

import time
import uuid

import orjson

from adapters.completions.wire import FINISH_IN, FINISH_OUT, TextCompletion
from adapters.fields import bad_upstream, load_object
from adapters.internal import ChatRequest, ChatResponse, Usage
from adapters.openai.usage import read_usage, render_usage
from contracts.errors import ClientError


def parse_response(body: bytes) -> ChatResponse:
    """The first choice's text and the whole call's usage (every choice's tokens, as reported)."""
    try:
        obj = load_object(body, "upstream response")
    except ClientError as e:
        raise bad_upstream(e.message) from None
    choices = obj.get("choices")
    if type(choices) is not list or not choices or type(choices[0]) is not dict:
        raise bad_upstream("no choices")
    text = choices[0].get("text")
    if type(text) is not str:
        raise bad_upstream("choices[0].text missing")
    fr = choices[0].get("finish_reason")
    usage = obj.get("usage")
    rid, model = obj.get("id"), obj.get("model")
    return ChatResponse(rid if type(rid) is str else "", model if type(model) is str else "", text,
                        finish_reason=FINISH_IN.get(fr, "stop") if type(fr) is str else "stop",
                        usage=read_usage(usage) if type(usage) is dict else Usage())


def render_response(resp: ChatResponse, *, model: str, request: ChatRequest | None = None) -> bytes:
    """A chat answer as a completion: its text (a refusal's, where it declined); reasoning has no place."""
    out: TextCompletion = {
        "id": resp.id or "cmpl-" + uuid.uuid4().hex,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"text": resp.content or resp.refusal or "", "index": 0, "logprobs": None,
                     "finish_reason": FINISH_OUT[resp.finish_reason]}],
        "usage": render_usage(resp.usage),
    }
    return orjson.dumps(out)
