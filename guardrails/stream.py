"""Output checks on a stream: text is held back `window` characters, checked, then released.

Sits between a stream's decoder and its encoder (internal events in, internal events out). A match or
a placeholder split across chunks is still seen whole: text is released only up to a cut that splits
neither. A block ends the stream with a StreamError (the encoder writes the caller's error event) and
drops everything after it.
"""

from __future__ import annotations

from adapters.internal import StreamError, StreamEvent, TextDelta, ToolCallDelta, ToolCallStart
from guardrails.policies import Check
from guardrails.scan import CallGuard, GuardrailBlocked, Verdict
from guardrails.vault import MAX_PLACEHOLDER


class StreamGuard:
    __slots__ = ("guard", "window", "step", "pending", "calls", "blocked", "released_chars", "held", "remote")

    def __init__(self, guard: CallGuard) -> None:
        self.guard = guard
        self.window = guard.checks.window
        # Checks another service answers see each released segment: a window's worth at a time, not
        # every `step` (each segment costs a round trip the caller waits for).
        self.remote = bool(guard.checks.remote_outputs)
        self.step = self.window if self.remote else max(8, self.window // 8)
        self.pending = ""  # answer text not yet released
        # Tool calls held whole (start and argument fragments by index) until the next other event:
        # arguments are JSON, checked and released as one fragment.
        self.calls: dict[int, tuple[ToolCallStart, list[str]]] = {}
        self.blocked: Verdict | None = None
        self.released_chars = 0  # what the caller got (a blocked stream is metered for this)
        # A structured answer is checked whole: every event held to the end (None: no such check).
        self.held: list[StreamEvent] | None = [] if guard.holds_whole_answer() else None

    def feed(self, events: list[StreamEvent], end: bool = False) -> list[StreamEvent]:
        if self.blocked is not None:
            return []
        if self.held is not None:
            self.held += events
            if not end:
                return []
            events, self.held = self.held, None
            try:
                self.guard.structured("".join(e.text for e in events if isinstance(e, TextDelta) and not e.refusal))
            except GuardrailBlocked as e:
                self.blocked = e.verdict
                return [StreamError(e.message, "invalid_request_error")]
        out: list[StreamEvent] = []
        for ev in events:
            if isinstance(ev, TextDelta) and not ev.refusal:
                if self.calls:
                    out += self._release_calls()
                self.pending += ev.text
            elif isinstance(ev, ToolCallStart):
                out += self._release(final=True)
                self.calls[ev.index] = (ev, [])
            elif isinstance(ev, ToolCallDelta) and ev.index in self.calls:
                self.calls[ev.index][1].append(ev.arguments)
            else:
                out += self._release(final=True)  # whatever comes next, the text before it goes first
                if self.blocked is None and self.calls:
                    out += self._release_calls()
                if self.blocked is not None:
                    return out
                out.append(self._refusal(ev) if isinstance(ev, TextDelta) else ev)
            if self.blocked is not None:
                return out
        # Text is checked once per read, and once `step` more than the window is held: each check
        # reads the whole held text, so checking per character would cost window times more.
        if end:
            out += self._release(final=True)
            if self.blocked is None and self.calls:
                out += self._release_calls()
        elif len(self.pending) >= self.window + self.step:
            out += self._release(final=False)
        return out

    def refuse(self, released: list[StreamEvent], e: GuardrailBlocked, chars: int) -> list[StreamEvent]:
        """A remote check blocked the text `released` carried: the events before its first text or tool
        call still go, then the error event; the caller got `chars` fewer characters than counted."""
        self.blocked, self.pending, self.calls, self.held = e.verdict, "", {}, None
        self.released_chars = max(0, self.released_chars - chars)
        keep: list[StreamEvent] = []
        for ev in released:
            if isinstance(ev, TextDelta | ToolCallStart | ToolCallDelta | StreamError):
                break
            keep.append(ev)
        return [*keep, StreamError(e.message, "invalid_request_error")]

    def _release_calls(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        calls, self.calls = self.calls, {}
        for start, parts in calls.values():
            try:
                args = self.guard.vault.restore(self.guard.scan("".join(parts), "output"))
            except GuardrailBlocked as e:
                self.blocked = e.verdict
                return [*out, StreamError(e.message, "invalid_request_error")]
            out.append(start)
            if args:
                out.append(ToolCallDelta(start.index, args))
        return out

    def _refusal(self, ev: TextDelta) -> StreamEvent:
        try:
            return TextDelta(self.guard.vault.restore(self.guard.scan(ev.text, "output")), refusal=True)
        except GuardrailBlocked as e:
            self.blocked = e.verdict
            return StreamError(e.message, "invalid_request_error")

    def _release(self, *, final: bool) -> list[StreamEvent]:
        text = self.pending
        if not text:
            return []
        cut = len(text) if final else len(text) - self.window
        spans: list[tuple[int, int]] = []
        block_at, blocker = -1, None  # the first block check's match: the text before it still goes out
        for c in self.guard.checks.outputs:
            if c.find is None:
                continue
            for s, e in c.find(text):
                if c.action == "block" and (e < len(text) or final) and (block_at < 0 or s < block_at):
                    block_at, blocker = s, c
                spans.append((s, e))
        if block_at >= 0:
            cut = block_at
        for s, e in spans:
            if s < cut < e:
                cut = s
        if self.guard.vault.restores and not final:  # an unclosed "[" near the cut may be a placeholder's start
            at = text.rfind("[", max(0, cut - MAX_PLACEHOLDER), cut)
            if at >= 0 and "]" not in text[at:cut]:
                cut = at
        out: list[StreamEvent] = []
        if cut > 0:
            segment, rest = text[:cut], text[cut:]
            try:
                segment = self.guard.vault.restore(self.guard.scan(segment, "output"))
            except GuardrailBlocked as e:
                self.blocked, self.pending = e.verdict, ""
                return [StreamError(e.message, "invalid_request_error")]
            self.pending = rest
            self.released_chars += len(segment)
            if segment:
                out.append(TextDelta(segment))
        if blocker is not None:
            out += self._block(blocker)
        return out

    def _block(self, check: Check) -> list[StreamEvent]:
        """A block check matched the held-back text: scanning it raises, which notes the verdict."""
        text, self.pending = self.pending, ""
        try:
            self.guard.scan(text, "output")
        except GuardrailBlocked as e:
            self.blocked = e.verdict
            return [StreamError(e.message, "invalid_request_error")]
        # The match needed what went before the cut (a lookbehind of an operator's regex): blocked all the same.
        self.blocked = v = Verdict(check.policy, check.name, "block", "output")
        self.guard.verdicts[v] = self.guard.verdicts.get(v, 0) + 1
        return [StreamError(GuardrailBlocked(v).message, "invalid_request_error")]


# Released text is asked about in pieces of at least this many's share (so at most about twice this
# many pieces at once, each a round trip).
MAX_SEGMENTS = 16


def segments(events: list[StreamEvent], size: int) -> list[list[StreamEvent]]:
    """`events` in groups whose text is about `size` characters (more when there would be more than
    MAX_SEGMENTS), text split at a space where one is near: remote checks see what was released a
    window at a time, so a block lets the pieces before it out, as a stream that came slower would."""
    total = sum(len(e.text) for e in events if isinstance(e, TextDelta) and not e.refusal)
    size = max(size, -(-total // MAX_SEGMENTS), 1)
    groups: list[list[StreamEvent]] = [[]]
    filled = 0
    for ev in events:
        if not isinstance(ev, TextDelta) or ev.refusal:
            groups[-1].append(ev)
            continue
        text = ev.text
        while filled + len(text) > size:
            cut = size - filled
            space = text.rfind(" ", max(cut // 2, cut - 32), cut)  # a piece is at least half the size
            cut = space + 1 if space >= 0 else cut
            if cut > 0:
                groups[-1].append(TextDelta(text[:cut]))
            groups.append([])
            filled, text = 0, text[cut:]
        if text:
            groups[-1].append(TextDelta(text))
            filled += len(text)
    return [g for g in groups if g]
