"""OpenAI's `n` as OpenAI-compatible servers (vLLM) answer it: the demo's one answer as n choices
(index 0 to n-1), usage counting each, in a whole body or in each streamed chunk."""

from __future__ import annotations

from typing import Any

import orjson


def _counted(usage: Any, n: int) -> None:
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
        usage["completion_tokens"] *= n
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage["completion_tokens"]


def several(body: bytes, n: int) -> bytes:
    """A chat completion's body with its choice given n times."""
    obj = orjson.loads(body)
    obj["choices"] = [{**obj["choices"][0], "index": i} for i in range(n)]
    _counted(obj.get("usage"), n)
    return orjson.dumps(obj)


def several_events(data: bytes, n: int) -> bytes:
    """Streamed chunks (whole SSE events) with each choice's chunk sent once per index."""
    out: list[bytes] = []
    for event in data.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            if event:
                out.append(event)
            continue
        obj = orjson.loads(event[len(b"data: "):])
        if obj.get("choices"):
            out += [b"data: " + orjson.dumps({**obj, "choices": [{**obj["choices"][0], "index": i}]})
                    for i in range(n)]
        else:  # the usage chunk
            _counted(obj.get("usage"), n)
            out.append(b"data: " + orjson.dumps(obj))
    return b"".join(e + b"\n\n" for e in out)
