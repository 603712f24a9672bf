"""Incremental Server-Sent Events framer: bytes in, events out (sans-I/O).

Follows the WHATWG framing rules that matter for LLM APIs: lines end in LF, CRLF or CR (a CRLF
split across two reads is one line end), `event:` and `data:` fields, multi-line data joined by
LF, `:` comment lines ignored, an event is dispatched on a blank line.
"""

from __future__ import annotations

from dataclasses import dataclass

from adapters.internal import StreamEvent

__all__ = ["SSEDecoder", "SSEEvent", "SSEFramer", "encode_event"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str | None
    data: bytes


class SSEFramer:
    """Feed raw bytes as they arrive; get whole events back."""

    __slots__ = ("_buf", "_event", "_data", "_cr_pending")

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._cr_pending = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        if self._cr_pending:
            # The previous read ended in CR: a leading LF here belongs to that line end.
            self._cr_pending = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if chunk[-1:] == b"\r":
            self._cr_pending = True
        buf = self._buf + chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        out: list[SSEEvent] = []
        for line in lines:
            self._line(line, out)
        return out

    def close(self) -> list[SSEEvent]:
        """End of input: flush a last line and an event that lacked its blank line (lenient)."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(self._buf, out)
            self._buf = b""
        if self._data:
            self._line(b"", out)
        return out

    def _line(self, line: bytes, out: list[SSEEvent]) -> None:
        if not line:
            if self._data:
                data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                out.append(SSEEvent(self._event, data))
            self._event = None
            self._data = []
            return
        if line[0] == 0x3A:  # ":" comment / keep-alive
            return
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        # id / retry / unknown fields carry nothing the adapters need.


class SSEDecoder:
    """The driver every protocol's stream decoder shares: frame the bytes, hand each event to
    `_event`, stop once `_done` is set (the protocol's terminator), and let `_cut` say what a
    stream that ended without one amounts to."""

    __slots__ = ("_sse", "_done")

    def __init__(self) -> None:
        self._sse = SSEFramer()
        self._done = False

    def feed(self, chunk: bytes) -> list[StreamEvent]:
        if self._done:
            return []
        out: list[StreamEvent] = []
        for ev in self._sse.feed(chunk):
            self._event(ev, out)
            if self._done:
                break
        return out

    def close(self) -> list[StreamEvent]:
        if self._done:
            return []
        out: list[StreamEvent] = []
        for ev in self._sse.close():
            self._event(ev, out)
            if self._done:
                return out
        self._done = True
        out.append(self._cut())
        return out

    def _event(self, ev: SSEEvent, out: list[StreamEvent]) -> None:
        raise NotImplementedError

    def _cut(self) -> StreamEvent:
        raise NotImplementedError


def encode_event(data: bytes, event: str | None = None) -> bytes:
    """One SSE event on the wire (data must not contain line breaks; orjson output never does)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + data + b"\n\n"
