"""Same-protocol requests: the client's own JSON body, with only the upstream's model name swapped in.

Provider-specific fields survive byte for byte; the body is parsed again only when something changes.
"""

from __future__ import annotations

import orjson

from adapters.internal import ChatRequest

__all__ = ["with_model"]


def with_model(body: bytes, req: ChatRequest, model: str, *, include_usage: bool = False) -> bytes:
    """`body` with `model` as its model name and, with `include_usage`, OpenAI's stream usage
    switched on; the very same bytes when neither changes anything."""
    if req.model == model and not include_usage:
        return body  # nothing to change: skip parsing the body a second time
    data = orjson.loads(body)
    changed = data.get("model") != model
    data["model"] = model
    if include_usage:
        data["stream_options"] = {**(data.get("stream_options") or {}), "include_usage": True}
        changed = True
    return orjson.dumps(data) if changed else body
