"""The exact cache's key: a hash over everything that changes an answer, and the scope.

Pure: the parsed internal request (messages, system, tools, tool_choice, response_format, every
sampling control), the model the request was routed to, the body's fields the internal form does
not model (a passthrough sends them upstream, so they may change the answer), and the scope's id
(a tenant name, a key store id, or nothing for `shared`). Not in it: `stream` and
`include_usage` (the stored answer is replayed either way), the caller's protocol (one entry
serves every protocol of a model), and nothing of a credential.
"""

from __future__ import annotations

import dataclasses
import hashlib

import orjson

from adapters.internal import ChatRequest
from adapters.json_types import JSONObject

_VERSION = b"rcache-v1"
# The body fields each protocol's parse already turns into the internal request: the rest of a body
# (frequency_penalty, logit_bias, metadata, ...) goes into the key as sent.
MODELED: dict[str, frozenset[str]] = {
    "openai": frozenset({"model", "messages", "tools", "tool_choice", "temperature", "top_p", "max_tokens",
                         "max_completion_tokens", "stop", "seed", "parallel_tool_calls", "response_format",
                         "stream", "stream_options", "top_k"}),
    "anthropic": frozenset({"model", "messages", "system", "tools", "tool_choice", "temperature", "top_p",
                            "top_k", "max_tokens", "stop_sequences", "stream"}),
}
_NOT_IN_KEY = frozenset({"stream", "stream_options", "model"})


def extras(protocol: str, body: JSONObject) -> JSONObject:
    """The body's fields the internal request does not hold (a protocol without a table here: every
    field but the stream switches and the model, so its entries are its own)."""
    modeled = MODELED.get(protocol, _NOT_IN_KEY)
    return {k: v for k, v in body.items() if k not in modeled}


def request_key(req: ChatRequest, *, model: str, scope_id: str, extra: JSONObject) -> str:
    """The entry's key: sha256 hex over the canonical request, the routed model and the scope."""
    canonical = dataclasses.replace(req, model="", stream=False, include_usage=False, task_id=None)
    h = hashlib.sha256(_VERSION)
    for part in (scope_id.encode(), model.encode(),
                 orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS),
                 orjson.dumps(extra, option=orjson.OPT_SORT_KEYS)):
        h.update(len(part).to_bytes(8, "big"))  # length-prefixed: no two part lists hash alike
        h.update(part)
    return h.hexdigest()
