"""Reference readers: what a stream or answer means, read without the adapters under test.

OpenAI and Anthropic bytes are read by the official SDKs (their stream parsers and
accumulators, their response models); Gemini, which has no SDK here, by the few lines of
`gemini_meaning` that follow Google's documented response shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import anthropic as anthropic_sdk
import openai as openai_sdk
import orjson

from adapters.sse import SSEFramer
from tests.adapters.sdk_streams import anthropic_message, openai_chunks, openai_completion


@dataclass(frozen=True)
class Meaning:
    text: str
    calls: tuple[tuple[str, str, dict], ...]  # (id, name, arguments)
    finish: str  # in the protocol's own vocabulary
    usage: tuple[int, int] | None  # (input, output); None where the bytes carry none


def _anthropic(msg: anthropic_sdk.types.Message) -> Meaning:
    text = "".join(b.text for b in msg.content if b.type == "text")
    calls = tuple((b.id, b.name, dict(b.input)) for b in msg.content if b.type == "tool_use")  # type: ignore[arg-type]
    u = msg.usage
    inp = u.input_tokens + (u.cache_creation_input_tokens or 0) + (u.cache_read_input_tokens or 0)
    return Meaning(text, calls, msg.stop_reason or "", (inp, u.output_tokens))


def _openai(message: object, finish: str, usage: object) -> Meaning:
    text = getattr(message, "content", None) or getattr(message, "refusal", None) or ""
    calls = tuple((tc.id, tc.function.name, orjson.loads(tc.function.arguments))
                  for tc in (getattr(message, "tool_calls", None) or []))
    u = (usage.prompt_tokens, usage.completion_tokens) if usage is not None else None  # type: ignore[attr-defined]
    return Meaning(text, calls, finish, u)


def openai_stream_meaning(raw: bytes) -> Meaning:
    """As a client application sees it: the SDK's own accumulator (`chat.completions.stream`)."""
    chunks, snap = openai_completion(raw)
    usage = next((c.usage for c in reversed(chunks) if c.usage is not None), None)
    choice = snap.choices[0]  # type: ignore[attr-defined]
    return _openai(choice.message, choice.finish_reason, usage)


def openai_upstream_stream_meaning(raw: bytes) -> Meaning:
    """An upstream's stream: the SDK's chunk parser, calls joined by their `index` as sent (some
    OpenAI-compatible servers number them from 1, which the SDK's accumulator cannot take)."""
    text, finish, usage = "", "", None
    calls: dict[int, list] = {}
    for c in openai_chunks(raw):
        usage = c.usage or usage
        for ch in c.choices:
            text += ch.delta.content or ch.delta.refusal or ""
            finish = ch.finish_reason or finish
            for tc in ch.delta.tool_calls or []:
                call = calls.setdefault(tc.index, [tc.id, "", ""])
                call[1] += (tc.function.name or "") if tc.function else ""
                call[2] += (tc.function.arguments or "") if tc.function else ""
    return Meaning(text, tuple((i, n, orjson.loads(a or "{}")) for i, n, a in calls.values()), finish,
                   (usage.prompt_tokens, usage.completion_tokens) if usage else None)


def anthropic_stream_meaning(raw: bytes) -> Meaning:
    return _anthropic(anthropic_message(raw))


def openai_response_meaning(raw: bytes) -> Meaning:
    c = openai_sdk.types.chat.ChatCompletion.model_validate(orjson.loads(raw))
    return _openai(c.choices[0].message, c.choices[0].finish_reason, c.usage)


def anthropic_response_meaning(raw: bytes) -> Meaning:
    return _anthropic(anthropic_sdk.types.Message.model_validate(orjson.loads(raw)))


def _gemini(chunks: list[dict]) -> Meaning:
    text, calls, finish, usage, sig = "", [], "", None, ""
    streaming: tuple[str, dict] | None = None  # a call whose arguments arrive as partialArgs
    for obj in chunks:
        cands = obj.get("candidates") or []
        if cands:
            for p in cands[0].get("content", {}).get("parts", []):
                if "text" in p and not p.get("thought"):
                    text += p["text"]
                fc = p.get("functionCall")
                if fc is None:
                    continue
                if streaming is None and fc.get("willContinue"):
                    streaming = (fc["name"], {})
                    sig = p.get("thoughtSignature", "")
                elif streaming is not None:
                    for piece in fc.get("partialArgs", []):  # top-level string pieces are all we meet
                        key = piece["jsonPath"][2:]
                        streaming[1][key] = streaming[1].get(key, "") + piece.get("stringValue", "")
                    if not fc:
                        calls.append((sig, *streaming))
                        streaming = None
                elif "name" in fc:
                    # Gemini calls have no id: the signature, if any, stands in its place here.
                    calls.append((fc.get("id") or p.get("thoughtSignature", ""), fc["name"], fc.get("args", {})))
            finish = cands[0].get("finishReason", finish)
        elif (obj.get("promptFeedback") or {}).get("blockReason"):
            finish = "SAFETY"  # a blocked prompt: no candidates, only the block reason
        u = obj.get("usageMetadata") or {}
        if "promptTokenCount" in u:
            usage = (u["promptTokenCount"], u.get("candidatesTokenCount", 0) + u.get("thoughtsTokenCount", 0))
    return Meaning(text, tuple(calls), finish, usage)


def gemini_stream_meaning(raw: bytes) -> Meaning:
    framer = SSEFramer()
    return _gemini([orjson.loads(ev.data) for ev in framer.feed(raw) + framer.close()])


def gemini_response_meaning(raw: bytes) -> Meaning:
    return _gemini([orjson.loads(raw)])


UPSTREAM_STREAM_READERS = {"openai": openai_upstream_stream_meaning, "anthropic": anthropic_stream_meaning,
                           "gemini": gemini_stream_meaning}
STREAM_READERS = {"openai": openai_stream_meaning, "anthropic": anthropic_stream_meaning,
                  "gemini": gemini_stream_meaning}
RESPONSE_READERS = {"openai": openai_response_meaning, "anthropic": anthropic_response_meaning,
                    "gemini": gemini_response_meaning}
