"""Prompt-cache markers across protocols: at most four to a request, as Anthropic and Bedrock allow.

Past four, the earliest markers go (in prompt order: tools, system, messages). A marker caches the
whole prompt before it, so the latest ones cover the most; an earlier one only adds a shorter
prefix to fall back on. Pure: renderers with markers call `capped` before they render.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from adapters.internal import CacheTtl, ChatRequest, ContentPart, Message, TextPart, ToolDef
from adapters.json_types import JSONObject
from contracts.errors import ClientError

__all__ = ["MAX_CACHE_MARKS", "capped", "mark_count"]

MAX_CACHE_MARKS = 4  # Anthropic's limit on cache_control blocks, Bedrock's on cachePoints

_T = TypeVar("_T", TextPart, ContentPart, ToolDef, Message)


def _marked(m: Message) -> int:
    return sum(p.cache is not None for p in m.content) + (m.cache is not None)


def mark_count(req: ChatRequest) -> int:
    return (sum(t.cache is not None for t in req.tools) + sum(b.cache is not None for b in req.system_blocks)
            + sum(_marked(m) for m in req.messages))


class _Dropper:
    """Clears the first `n` markers it is shown, in the order it is shown them."""

    __slots__ = ("left",)

    def __init__(self, n: int) -> None:
        self.left = n

    def one(self, x: _T) -> _T:
        if self.left and x.cache is not None:
            self.left -= 1
            return replace(x, cache=None)
        return x

    def message(self, m: Message) -> Message:
        if not self.left or not _marked(m):
            return m
        content = tuple(self.one(p) for p in m.content)
        return self.one(replace(m, content=content))


def capped(req: ChatRequest) -> ChatRequest:
    """`req` with at most MAX_CACHE_MARKS markers, the earliest excess dropped."""
    excess = mark_count(req) - MAX_CACHE_MARKS
    if excess <= 0:
        return req
    drop = _Dropper(excess)
    tools = tuple(drop.one(t) for t in req.tools)
    system_blocks = tuple(drop.one(b) for b in req.system_blocks)
    messages = tuple(drop.message(m) for m in req.messages)
    return replace(req, tools=tools, system_blocks=system_blocks, messages=messages)


def marker_ttl(marker: JSONObject, where: str) -> CacheTtl:
    """A cache marker's `ttl` (Anthropic's `cache_control`, Converse's `cachePoint`): 5 minutes unless 1h."""
    ttl = marker.get("ttl", "5m")
    if ttl == "1h":
        return "1h"
    if ttl == "5m":
        return "5m"
    raise ClientError(f"{where}.ttl must be '5m' or '1h'")
