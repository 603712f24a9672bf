"""Several answers to one call, as the servers the demos stand in for give them: OpenAI's `n`
(vLLM, OpenAI: `choices` with index 0 to n-1) and Gemini's `candidateCount` (`candidates`), the
demo's one answer repeated, usage counting each, in a whole body or in each streamed chunk."""

from __future__ import annotations

from typing import Any

import orjson

from devstack.demo.sse_rewrite import rewrite_events


def _counted(obj: dict[str, Any], n: int) -> None:
    usage = obj.get("usage")
    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):  # OpenAI's
        usage["completion_tokens"] *= n
        usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage["completion_tokens"]
    meta = obj.get("usageMetadata")
    if isinstance(meta, dict) and isinstance(meta.get("candidatesTokenCount"), int):  # Gemini's
        meta["candidatesTokenCount"] *= n
        meta["totalTokenCount"] = meta.get("promptTokenCount", 0) + meta["candidatesTokenCount"]


def _repeated(obj: dict[str, Any], n: int) -> dict[str, Any]:
    field = "choices" if "choices" in obj else "candidates"
    if obj.get(field):
        obj[field] = [{**obj[field][0], "index": i} for i in range(n)]
    _counted(obj, n)
    return obj


def several(body: bytes, n: int) -> bytes:
    """A whole answer's body with its one choice (candidate) given n times."""
    return orjson.dumps(_repeated(orjson.loads(body), n))


def several_events(data: bytes, n: int) -> bytes:
    """Streamed chunks (whole SSE events): OpenAI's each choice's chunk once per index, Gemini's
    the candidates of a chunk n times in it."""
    def chunk(obj: dict[str, Any]) -> list[dict[str, Any]]:
        if obj.get("choices"):
            return [{**obj, "choices": [{**obj["choices"][0], "index": i}]} for i in range(n)]
        return [_repeated(obj, n)]  # OpenAI's usage chunk, or a Gemini chunk
    return rewrite_events(data, chunk)
