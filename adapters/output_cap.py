"""A client's own request body with its output cap lowered (routing.output_limit: clamp on a
passthrough call): the cap's field in each client protocol, every other byte's meaning kept."""

from __future__ import annotations

import orjson

# Where each client protocol puts its output cap: a path of keys into the body's object. OpenAI's
# chat takes either field (max_completion_tokens wins when both are sent), so both are lowered.
_CAP_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "openai": (("max_completion_tokens",), ("max_tokens",)),
    "anthropic": (("max_tokens",),),
    "gemini": (("generationConfig", "maxOutputTokens"),),
    "responses": (("max_output_tokens",),),
    "completions": (("max_tokens",),),
}


def with_output_cap(protocol: str, body: bytes, cap: int) -> bytes:
    """`body` with every output-cap field it holds above `cap` set to `cap`; unchanged (the same
    object) where it holds none, or the protocol has no known field."""
    paths = _CAP_PATHS.get(protocol)
    if not paths:
        return body
    obj = orjson.loads(body)
    changed = False
    for path in paths:
        parent = obj
        for key in path[:-1]:
            parent = parent.get(key) if type(parent) is dict else None
        last = path[-1]
        if type(parent) is dict and type(parent.get(last)) is int and parent[last] > cap:
            parent[last] = cap
            changed = True
    return orjson.dumps(obj) if changed else body
