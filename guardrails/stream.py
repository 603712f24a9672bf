"""Output checks on a stream: text is held back `window` characters, checked, then released.

Sits between a stream's decoder and its encoder (internal events in, internal events out). A match or
a placeholder split across chunks is still seen whole: text is released only up to a cut that splits
neither. A block ends the stream with a StreamError (the encoder writes the caller's error event) and
drops everything after it.
"""

from __future__ import annotations

from adapters.internal import StreamError, StreamEvent, TextDelta
from guardrails.scan import CallGuard, GuardrailBlocked, Verdict
from guardrails.vault import MAX_PLACEHOLDER


class StreamGuard:
    __slots__ = ("guard", "window", "step", "pending", "blocked", "released_chars")

    def __init__(self, guard: CallGuard) -> None:
        self.guard = guard
        self.window = guard.checks.window
        self.step = max(8, self.window // 8)
        self.pending = ""  # answer text not yet released
        self.blocked: Verdict | None = None
        self.released_chars = 0  # what the caller got (a blocked stream is metered for this)

    def feed(self, events: list[StreamEvent], end: bool = False) -> list[StreamEvent]:
        if self.blocked is not None:
            return []
        out: list[StreamEvent] = []
        for ev in events:
            if type(ev) is TextDelta and not ev.refusal:
                self.pending += ev.text
            else:
                out += self._release(final=True)  # whatever comes next, the text before it goes first
                if self.blocked is not None:
                    return out
                out.append(self._refusal(ev) if type(ev) is TextDelta else ev)
            if self.blocked is not None:
                return out
        # Text is checked once per read, and once `step` more than the window is held: each check
        # reads the whole held text, so checking per character would cost window times more.
        if end:
            out += self._release(final=True)
        elif len(self.pending) >= self.window + self.step:
            out += self._release(final=False)
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
        for c in self.guard.checks.outputs:
            if c.find is None:
                continue
            for s, e in c.find(text):
                if c.action == "block" and (e < len(text) or final):
                    return self._block(c.policy, c.name)
                if s < cut < e:
                    cut = s
        if cut <= 0:
            return []
        if self.guard.vault.restores:  # an unclosed "[" near the cut may be a placeholder's start
            at = text.rfind("[", max(0, cut - MAX_PLACEHOLDER), cut)
            if at >= 0 and "]" not in text[at:cut] and not final:
                cut = at
                if cut <= 0:
                    return []
        segment, self.pending = text[:cut], text[cut:]
        try:
            segment = self.guard.vault.restore(self.guard.scan(segment, "output"))
        except GuardrailBlocked as e:
            self.blocked = e.verdict
            return [StreamError(e.message, "invalid_request_error")]
        self.released_chars += len(segment)
        return [TextDelta(segment)] if segment else []

    def _block(self, policy: str, check: str) -> list[StreamEvent]:
        """A block check matched the held-back text: scan it (which raises) to note the verdict."""
        text, self.pending = self.pending, ""
        try:
            self.guard.scan(text, "output")
        except GuardrailBlocked as e:
            self.blocked = e.verdict
            return [StreamError(e.message, "invalid_request_error")]
        # The match's context changed between the two reads (it cannot: same text): fail closed anyway.
        v = Verdict(policy, check, "block", "output")
        self.guard.verdicts[v] = self.guard.verdicts.get(v, 0) + 1
        self.blocked = v
        return [StreamError(f"guardrail policy {policy!r} blocked this answer (check {check!r})",
                            "invalid_request_error")]
