"""A cached answer: the internal ChatResponse (one entry serves every caller protocol of the
model: each caller's adapter renders it, plain or as a stream) and what the store indexes it by."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from adapters.internal import CacheTokens, ChatResponse, ReasoningPart, ToolCall, Usage


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    tenant: str  # the tenant whose call stored it (purge by tenant; `shared` entries too)
    model: str
    stored_at: float  # unix seconds
    expires_at: float
    body: bytes  # encode(response)
    # A semantic model's entry: its partition (semantic_key.py) and the last message's vector (float32 bytes).
    partition: str = ""
    vector: bytes = b""

    @property
    def size(self) -> int:
        """What the entry weighs against the store's bound: its answer and its vector."""
        return len(self.body) + len(self.vector)


def encode(resp: ChatResponse) -> bytes:
    return orjson.dumps(resp)


def decode(body: bytes) -> ChatResponse:
    d: dict[str, Any] = orjson.loads(body)
    u = d["usage"]
    return ChatResponse(
        id=d["id"], model=d["model"], content=d["content"],
        tool_calls=tuple(ToolCall(**t) for t in d["tool_calls"]), finish_reason=d["finish_reason"],
        usage=Usage(u["input_tokens"], u["output_tokens"], CacheTokens(**u["cache"])),
        refusal=d["refusal"], untranslatable=d["untranslatable"],
        reasoning=tuple(ReasoningPart(**r) for r in d["reasoning"]))
