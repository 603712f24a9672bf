"""Usage as a stream goes by: the upstream's own counts where it reports them, otherwise an
estimate from what passed through, so a stream cut short is still charged for what it carried."""

from __future__ import annotations

from adapters.internal import (
    NO_CACHE,
    CacheTokens,
    StreamEnd,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageUpdate,
)

# The same rough ratio `estimate_prompt_tokens` uses: about four characters a token.
CHARS_PER_TOKEN = 4


class StreamUsage:
    __slots__ = ("input_tokens", "output_tokens", "cache", "web_searches", "streamed_chars", "ended")

    def __init__(self) -> None:
        self.input_tokens: int | None = None  # as reported (cumulative), None until reported
        self.output_tokens: int | None = None
        self.cache: CacheTokens = NO_CACHE  # the cache part of input_tokens, as last reported
        self.web_searches = 0  # as last reported: billed however the stream ends
        self.streamed_chars = 0  # text and tool-call arguments that passed through
        # The upstream's own end marker went by: its counts are final, however the stream closes after.
        self.ended = False

    def observe(self, events: list[StreamEvent]) -> None:
        for ev in events:
            if isinstance(ev, TextDelta):
                self.streamed_chars += len(ev.text)
            elif isinstance(ev, ToolCallDelta):
                self.streamed_chars += len(ev.arguments)
            elif isinstance(ev, UsageUpdate):
                if ev.input_tokens is not None:
                    self.input_tokens = ev.input_tokens
                if ev.output_tokens is not None:
                    self.output_tokens = ev.output_tokens
                if ev.cache is not None:
                    self.cache = ev.cache
                if ev.web_searches is not None:
                    self.web_searches = ev.web_searches
            elif isinstance(ev, StreamEnd):
                self.ended = True

    @property
    def reported(self) -> Usage:
        """What the upstream said, 0 where it said nothing (a stream that ended normally)."""
        return Usage(self.input_tokens or 0, self.output_tokens or 0, self.cache, self.web_searches)

    def partial(self, est_input_tokens: int) -> Usage:
        """For a stream that ended early: reported counts where there are any, else estimates
        (the prompt estimate charged on arrival; the output that streamed, chars / 4)."""
        streamed = -(-self.streamed_chars // CHARS_PER_TOKEN)
        return Usage(self.input_tokens if self.input_tokens is not None else est_input_tokens,
                     max(self.output_tokens or 0, streamed), self.cache, self.web_searches)
