"""What a semantic lookup compares (pure): the last user message's text goes through similarity;
everything else that changes an answer must match exactly, as a "partition" hash.

The partition covers the scope, the routed model, the embedder (model and dimensions: vectors of two
embedders are never compared), the system prompt, every earlier turn, tools, tool_choice,
response_format, every sampling control and the body's unmodeled fields: the exact key's inputs
less the last message's text. Only the last message is embedded, not the conversation: in a long
conversation the shared history would dominate a whole-conversation vector and a different last
question would still score high. A last message that is not plain user text (images, documents,
tool results) has no semantic probe: such requests use the exact cache only.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

import orjson

from adapters.internal import ChatRequest, TextPart
from adapters.json_types import JSONObject

_VERSION = b"rcache-semantic-v1"


@dataclass(frozen=True, slots=True)
class SemanticProbe:
    partition: str  # sha256 hex: requests that may share an answer when their texts are alike
    text: str  # what is embedded


def semantic_probe(req: ChatRequest, *, model: str, scope_id: str, extra: JSONObject, embedder: str,
                   dimensions: int | None) -> SemanticProbe | None:
    """The partition and the text of `req`, or None when its last message is not plain user text."""
    if not req.messages:
        return None
    last = req.messages[-1]
    if last.role != "user" or last.tool_calls or not last.content or any(type(p) is not TextPart for p in last.content):
        return None
    text = "".join(p.text for p in last.content if type(p) is TextPart)
    if not text.strip():
        return None
    rest = dataclasses.replace(req, model="", stream=False, include_usage=False, task_id=None,
                               messages=req.messages[:-1])
    h = hashlib.sha256(_VERSION)
    for part in (scope_id.encode(), model.encode(), f"{embedder}:{dimensions or ''}".encode(),
                 orjson.dumps(rest, option=orjson.OPT_SORT_KEYS),
                 orjson.dumps(extra, option=orjson.OPT_SORT_KEYS)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return SemanticProbe(h.hexdigest(), text)
