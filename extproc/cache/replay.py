"""Stored answers and streams, both ways (pure): `events` turns a ChatResponse into the internal
stream events a protocol's encoder renders (a replayed stream its SDK parses like a live one);
`Assembly` gathers a live stream's events into the ChatResponse to store, or says it is not whole."""

from __future__ import annotations

from adapters.internal import (
    ChatResponse,
    FinishReason,
    ReasoningDelta,
    ReasoningPart,
    StreamEnd,
    StreamError,
    StreamEvent,
    StreamFinish,
    StreamStart,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolCallStart,
    Usage,
    UsageUpdate,
)


def events(resp: ChatResponse) -> list[StreamEvent]:
    """The answer as one stream: start, reasoning, text, tool calls, finish, usage, end."""
    u = resp.usage
    out: list[StreamEvent] = [StreamStart(resp.id, resp.model),
                              UsageUpdate(u.input_tokens, 0, u.cache or None)]
    for r in resp.reasoning:
        out.append(ReasoningDelta(r.text, r.signature, r.redacted))
    if resp.refusal:
        out.append(TextDelta(resp.refusal, refusal=True))
    if resp.content:
        out.append(TextDelta(resp.content))
    for i, tc in enumerate(resp.tool_calls):
        out.append(ToolCallStart(i, tc.id, tc.name, tc.signature))
        out.append(ToolCallDelta(i, tc.arguments))
    out += [StreamFinish(resp.finish_reason), UsageUpdate(u.input_tokens, u.output_tokens, u.cache or None),
            StreamEnd()]
    return out


class Assembly:
    """A stream's events, gathered; `response()` is the whole answer, or None when the stream
    failed, was cut (no end seen) or never finished."""

    __slots__ = ("id", "model", "text", "refusal", "reasoning", "_reasoning_text", "calls", "finish",
                 "usage", "ended", "failed")

    def __init__(self) -> None:
        self.id = self.model = ""
        self.text: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: list[ReasoningPart] = []
        self._reasoning_text: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, signature or "", arguments...]
        self.finish: FinishReason | None = None
        self.usage = Usage()
        self.ended = self.failed = False

    def feed(self, evs: list[StreamEvent]) -> None:
        for ev in evs:
            t = type(ev)
            if t is TextDelta:
                (self.refusal if ev.refusal else self.text).append(ev.text)  # type: ignore[union-attr]
            elif t is ReasoningDelta:
                self._reasoning(ev)  # type: ignore[arg-type]
            elif t is ToolCallStart:
                self.calls[ev.index] = [ev.id, ev.name, ev.signature or ""]  # type: ignore[union-attr]
            elif t is ToolCallDelta:
                self.calls.setdefault(ev.index, ["", "", ""]).append(ev.arguments)  # type: ignore[union-attr]
            elif t is StreamFinish:
                self.finish = ev.reason  # type: ignore[union-attr]
            elif t is UsageUpdate:
                u = self.usage
                self.usage = Usage(u.input_tokens if ev.input_tokens is None else ev.input_tokens,  # type: ignore[union-attr]
                                   u.output_tokens if ev.output_tokens is None else ev.output_tokens,  # type: ignore[union-attr]
                                   u.cache if ev.cache is None else ev.cache)  # type: ignore[union-attr]
            elif t is StreamStart:
                self.id, self.model = ev.id, ev.model  # type: ignore[union-attr]
            elif t is StreamEnd:
                self.ended = True
            elif isinstance(ev, StreamError):
                self.failed = True

    def _reasoning(self, ev: ReasoningDelta) -> None:
        if ev.redacted:
            self.reasoning.append(ReasoningPart("", ev.signature, True))
            return
        self._reasoning_text.append(ev.text)
        if ev.signature is not None:  # a signature ends its part
            self.reasoning.append(ReasoningPart("".join(self._reasoning_text), ev.signature))
            self._reasoning_text.clear()

    def response(self) -> ChatResponse | None:
        if self.failed or not self.ended or self.finish is None or self.finish == "error":
            return None
        reasoning = list(self.reasoning)
        if self._reasoning_text:
            reasoning.append(ReasoningPart("".join(self._reasoning_text)))
        calls = tuple(ToolCall(c[0], c[1], "".join(c[3:]), c[2] or None) for _, c in sorted(self.calls.items()))
        return ChatResponse(self.id, self.model, "".join(self.text), calls, self.finish, self.usage,
                            "".join(self.refusal) or None, None, tuple(reasoning))
