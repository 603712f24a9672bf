"""Reasoning across protocols (pure): a deployment's `reasoning` policy over answers and streams,
and the one way reasoning parts become plain text where a protocol has only a text field."""

from __future__ import annotations

from dataclasses import replace

from adapters.internal import ChatResponse, ReasoningDelta, ReasoningPart, StreamEvent

__all__ = ["drop_reasoning", "reasoning_text", "without_reasoning"]


def without_reasoning(resp: ChatResponse) -> ChatResponse:
    """The answer less its reasoning (`reasoning: drop`, as OpenAI's Chat Completions hides it)."""
    return replace(resp, reasoning=()) if resp.reasoning else resp


def drop_reasoning(events: list[StreamEvent]) -> list[StreamEvent]:
    """The stream's events less its reasoning deltas (`reasoning: drop`)."""
    return [ev for ev in events if type(ev) is not ReasoningDelta]


def reasoning_text(parts: tuple[ReasoningPart, ...]) -> str:
    """The visible reasoning as one text (chat's `reasoning_content`): redacted parts have none."""
    return "\n\n".join(p.text for p in parts if p.text and not p.redacted)
