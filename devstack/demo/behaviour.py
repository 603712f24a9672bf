"""What every demo LLM upstream answers, whatever protocol it speaks: deterministic and
input-dependent, so a test can tell which upstream answered and that the input arrived intact.

- the reply is "<prefix> echo: <text of the last user message>";
- with tools, a last user message containing "weather" gets a call to the first tool with
  arguments {"city": <last word of the message, punctuation stripped>};
- a last message carrying a tool result gets "<prefix> tool said: <result content>";
- usage: input tokens = words in system prompt + all message texts, output tokens = words in
  the reply (for a tool call: words in its arguments JSON);
- prompt cache: a last user message containing "cache-hit" ("cache-write") reports every input
  word before that message as read from (written to) the prompt cache, in the protocol's own fields;
  an upstream with explicit caching only (Bedrock) does so only when the request carried a cache
  marker (a `cachePoint`), and counts a write as a 1-hour write when a marker asked for 1h;
- streams send one text event per word (and tool arguments in two fragments);
- a model named `llama-guard*` answers as a safety classifier instead (`devstack.demo.guard_classifier`:
  `safe`, or `unsafe` and the categories), for the `classify` guardrail;
- embeddings (`demo_embedding`) depend on the text alone: the same text gets the same vector from
  every demo upstream, whatever protocol it speaks; similar texts get similar vectors (trigram hashing).
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

import orjson

from adapters.internal import (
    NO_CACHE,
    CacheTokens,
    ChatRequest,
    ChatResponse,
    StreamEnd,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    UsageUpdate,
    message_text,
)
from devstack.demo.guard_classifier import is_classifier, verdict

_PUNCT = ".,!?;:\"'()[]{}"


def last_user_text(req: ChatRequest) -> str:
    return next((message_text(m) for m in reversed(req.messages) if m.role == "user"), "")


def _marks(req: ChatRequest) -> set[str]:
    """The TTLs of the request's prompt-cache markers."""
    parts = [*req.tools, *req.system_blocks, *req.messages, *(p for m in req.messages for p in m.content)]
    return {x.cache for x in parts if x.cache is not None}


def _cache(req: ChatRequest, words_in: int, explicit: bool) -> CacheTokens:
    """The demo's prompt cache: the prompt before the last message, when that message asks (and,
    `explicit`, when a marker asked to cache it)."""
    last = message_text(req.messages[-1]) if req.messages else ""
    prefix = words_in - len(last.split())
    marks = _marks(req) if explicit else set()
    if explicit and not marks:
        return NO_CACHE
    if "cache-hit" in last:
        return CacheTokens(read=prefix)
    return CacheTokens(write=prefix, write_1h=prefix if "1h" in marks else 0) if "cache-write" in last else NO_CACHE


def demo_reply(req: ChatRequest, prefix: str, *, response_id: str = "demo-0",
               explicit_cache: bool = False) -> ChatResponse:
    """The deterministic answer every demo upstream gives to `req`."""
    words_in = len(req.system.split()) if req.system else 0
    for m in req.messages:
        words_in += len(message_text(m).split())
    last = req.messages[-1]
    if is_classifier(req.model):  # a Llama-Guard-style verdict on the text, not an echo
        text = verdict(last_user_text(req))
        return ChatResponse(response_id, req.model, text, (), "stop", Usage(words_in, len(text.split()), NO_CACHE))
    if last.role == "tool":
        text = f"{prefix} tool said: {message_text(last)}"
    else:
        user_text = last_user_text(req)
        if last.role == "user" and req.tools and "weather" in user_text.lower():
            words = user_text.split()
            city = words[-1].strip(_PUNCT) if words else ""
            args = orjson.dumps({"city": city}).decode()
            call = ToolCall("call_0", req.tools[0].name, args)
            return ChatResponse(response_id, req.model, "", (call,), "tool_calls",
                                Usage(words_in, len(args.split()), _cache(req, words_in, explicit_cache)))
        text = f"{prefix} echo: {user_text}"
        if "demo-show-max-tokens" in user_text:  # what output cap reached the upstream (routing.output_limit)
            text += f" max_tokens={req.max_tokens}"
    return ChatResponse(response_id, req.model, text, (), "stop", Usage(words_in, len(text.split()), _cache(req, words_in, explicit_cache)))


def demo_stream_events(resp: ChatResponse) -> list[StreamEvent]:
    """The reply cut into stream events: one text delta per word, tool arguments in two parts."""
    u = resp.usage
    events: list[StreamEvent] = [UsageUpdate(u.input_tokens, 0, u.cache or None), StreamStart(resp.id, resp.model)]
    words = resp.content.split(" ") if resp.content else []
    for i, w in enumerate(words):
        events.append(TextDelta(w if i == len(words) - 1 else w + " "))
    for n, tc in enumerate(resp.tool_calls):
        events.append(ToolCallStart(n, tc.id, tc.name))
        half = len(tc.arguments) // 2
        events.append(ToolCallDelta(n, tc.arguments[:half]))
        events.append(ToolCallDelta(n, tc.arguments[half:]))
    events += [StreamFinish(resp.finish_reason), UsageUpdate(u.input_tokens, u.output_tokens, u.cache or None),
               StreamEnd()]
    return events


DEMO_EMBED_DIMS = 8  # the default vector length; `dimensions` / `outputDimensionality` ask for another
MAX_DEMO_EMBED_DIMS = 4096


_TRIGRAM_BUCKETS = 4096


@functools.lru_cache(maxsize=8)
def _projection(dims: int) -> Any:
    """A fixed random matrix per dimension (seeded by it): trigram buckets -> dense vectors."""
    import numpy as np

    return np.random.default_rng(dims).standard_normal((_TRIGRAM_BUCKETS, dims)).astype(np.float32)


def demo_embedding(text: str, dims: int | None = None) -> list[float]:
    """A deterministic vector for `text` that places similar texts close: the character trigrams of
    the lower-cased, punctuation-free text, each hashed (crc32) to a bucket and a sign, projected
    by a fixed random matrix (a dense vector whose angles follow the trigram counts'), scaled to
    [-1, 1) in steps of 1/128 so every value is exact in float32 and survives base64 and JSON alike.
    Case, punctuation and a changed word cost little similarity; an unrelated text shares few
    trigrams (what the semantic response cache's demo relies on)."""
    import numpy as np  # on the first embedding, not at start: most demo upstreams never embed

    n = dims or DEMO_EMBED_DIMS
    words = "".join(" " if c in _PUNCT else c for c in text.lower()).split()
    padded = f" {' '.join(words)} "
    hashes = [zlib.crc32(padded[i:i + 3].encode()) for i in range(len(padded) - 2)]
    if not words:
        return [0.0] * n
    signs = np.array([1.0 if h & 0x80000000 else -1.0 for h in hashes], np.float32)
    v = signs @ _projection(n)[[h % _TRIGRAM_BUCKETS for h in hashes]]
    v = np.clip(np.round(v / float(np.abs(v).max()) * 128), -128, 127) / 128
    out: list[float] = v.astype(np.float64).tolist()
    return out
