"""Vertex AI streams: Gemini's SSE (`data:` lines only) or Anthropic's (`event:` lines first), told
apart by the first bytes, then decoded by that protocol's own decoder."""

from __future__ import annotations

from adapters import anthropic, gemini
from adapters.internal import StreamEvent
from adapters.protocol import StreamDecoder as Decoder

__all__ = ["StreamDecoder", "StreamEncoder"]

_SNIFF_BYTES = 6  # len(b"event:"): enough to tell, leading blank lines aside


class StreamDecoder:
    """Upstream Vertex SSE bytes -> internal stream events."""

    __slots__ = ("_inner", "_held")

    def __init__(self) -> None:
        self._inner: Decoder | None = None
        self._held = b""

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        if self._inner is not None:
            return self._inner.feed(chunk)
        self._held += chunk
        head = self._held.lstrip(b"\r\n")
        if len(head) < _SNIFF_BYTES:
            return []
        self._inner = anthropic.StreamDecoder() if head.startswith(b"event:") else gemini.StreamDecoder()
        held, self._held = self._held, b""
        return self._inner.feed(held)

    def close(self) -> list[StreamEvent]:
        if self._inner is None:  # too short to tell: Gemini's decoder says what a cut stream is
            self._inner = gemini.StreamDecoder()
            held, self._held = self._held, b""
            return self._inner.feed(held) + self._inner.close()
        return self._inner.close()


StreamEncoder = gemini.StreamEncoder
