"""An OpenAI stream passed through as the upstream sent it, less the usage chunk the gateway asked for.

Metering needs usage on every OpenAI stream, so the upstream request asks for it
(`stream_options.include_usage`) even when the client did not. That client must still get the
upstream's own bytes (logprobs, `delta.refusal`, `system_fingerprint`, reasoning fields,
annotations, whatever comes next) with only that one chunk removed: re-encoding through the
internal format would keep just what the internal format knows.
"""

from __future__ import annotations

import re

import orjson

from adapters import openai
from adapters.internal import StreamEnd, StreamError, StreamEvent, Usage
from adapters.protocol import StreamDecoder
from adapters.sse import SSEFramer, encode_event
from adapters.stream_usage import StreamUsage

__all__ = ["DeferredTextUsage", "InjectedUsageFilter", "is_usage_chunk"]

# A blank line ends an SSE event; a lone CR is a line end too, CRLF is one line end, not two.
_EVENT_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
# A chunk that reports usage (an object, not the `"usage":null` every chunk carries with usage on).
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
# Streamed text and tool arguments, for the estimate a cut stream is charged (StreamUsage.partial).
_NO_CHOICES = re.compile(rb'"choices": ?\[\]')  # the usage-only chunk's mark (is_usage_chunk confirms)
# Text: a completion's. The unrolled loop (runs of plain bytes, then one escape) is 0.7x the time of
# `(?:[^"\\]|\\.)*`, the same strings.
_TEXT = re.compile(rb'"(?:content|refusal|arguments|text)":"([^"\\]*(?:\\.[^"\\]*)*)"')
_DONE = b"data: [DONE]\n\n"  # the stream's end marker, as a region's last event
# Regions whose text waits to be counted, at most (then counted): what a stream holds on to for it.
_DEFER_BYTES = 64 * 1024


def is_usage_chunk(raw: bytes) -> bool:
    """Whether one raw SSE event is OpenAI's usage-only chunk (`choices: []` and a usage object)."""
    # Cheap byte checks first: with usage on, every chunk carries `"usage":null`.
    if b'"usage"' not in raw or (b'"choices":[]' not in raw and b'"choices": []' not in raw):
        return False
    framer = SSEFramer()
    events = framer.feed(raw) + framer.close()
    if len(events) != 1:
        return False
    try:
        obj = orjson.loads(events[0].data)
    except orjson.JSONDecodeError:
        return False
    return type(obj) is dict and obj.get("choices") == [] and type(obj.get("usage")) is dict


class DeferredTextUsage(StreamUsage):
    """A passthrough stream's usage, its streamed text counted only when an estimate needs it: a
    stream that reaches its end marker is charged the upstream's own usage, and never counts the
    regions still waiting (up to _DEFER_BYTES of its end; all of a short one)."""

    __slots__ = ("_regions", "_size")

    def __init__(self) -> None:
        super().__init__()
        self._regions: list[bytes] = []
        self._size = 0

    def defer(self, region: bytes) -> None:
        """`region`'s text (what `_TEXT` finds) is streamed text, counted later."""
        self._regions.append(region)
        self._size += len(region)
        if self._size > _DEFER_BYTES:
            self.count()

    def count(self) -> None:
        """`streamed_chars` made whole: the waiting regions counted."""
        if self._regions:
            self.streamed_chars += sum(sum(map(len, _TEXT.findall(r))) for r in self._regions)
            self._regions.clear()
            self._size = 0

    def partial(self, est_input_tokens: int) -> Usage:
        self.count()
        return super().partial(est_input_tokens)


class InjectedUsageFilter:
    """Upstream OpenAI SSE bytes in, the same bytes out minus the usage chunk; `meter` still sees
    the usage. Same attributes as `registry.StreamTranslator`, so a flow drives either."""

    __slots__ = ("_buf", "_decoder", "meter", "finished", "error")

    def __init__(self, decoder: StreamDecoder | None = None) -> None:
        self._buf = b""
        # A reader alongside, for usage and the stream's end: Chat Completions', or Completions' chunks.
        self._decoder = decoder if decoder is not None else openai.StreamDecoder()
        self.meter = DeferredTextUsage()
        self.finished = False
        self.error: str | None = None

    def _track(self, events: list[StreamEvent]) -> StreamError | None:
        self.meter.observe(events)
        cut = None
        for ev in events:
            if isinstance(ev, StreamEnd):
                self.finished = True
            elif isinstance(ev, StreamError):
                self.error = ev.message
                cut = ev
        return cut

    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk if self._buf else chunk
        # Whole events go out as they are; only a region holding the usage chunk is split.
        if b"\r" not in buf:  # LF line ends (the usual): one search
            end = buf.rfind(b"\n\n") + 2 if b"\n\n" in buf else 0
        else:
            end = max((i + len(sep) for sep in (b"\n\n", b"\r\n\r\n", b"\r\r") if (i := buf.rfind(sep)) >= 0),
                      default=0)
        if not end or (end == len(buf) and buf.endswith(b"\r")):
            self._buf = buf  # no whole event yet (or a CRLF may be cut in two)
            return b""
        region, self._buf = buf[:end], buf[end:]
        if not self._scan(region) or (b'"choices":[]' not in region and b'"choices": []' not in region):
            return region  # no usage object went by: no usage-only chunk to cut
        return self._strip(region)

    def _scan(self, region: bytes) -> bool:
        """Meter whole events by byte scans: only the events that can change the outcome (usage,
        errors, [DONE], anything not a one-line `data: {...}`) go through the real decoder. True
        where a usage object went by (only then can the region hold the usage-only chunk)."""
        # Parsing every chunk cost more CPU than a whole peer gateway spends on the stream (docs/performance.md).
        if b"\r" in region:  # CR line ends: the decoder's own framing
            self._track(self._decoder.feed(region))
            return True
        n = len(region)
        # The stream's end marker, after the last chunk: read apart, so the region's chunks stay one shape.
        stop = n - len(_DONE) if region.endswith(_DONE) and region.endswith(b"}\n\n", 0, n - len(_DONE)) else n
        # Every event a one-line `data: {...}`: all its line ends are the blank lines between such events.
        if not (region.startswith(b"data: {") and region.endswith(b"}\n\n", 0, stop)
                and region.count(b"\n", 0, stop) == 2 * region.count(b"}\n\ndata: {", 0, stop) + 2):
            return self._scan_events(region)
        # Region-wide searches, not a loop over its ~100 events; only the events they hit are decoded.
        marks = [m.start() for m in _USAGE.finditer(region, 0, stop)]
        usage = bool(marks)
        i = region.find(b'"error"', 0, stop)
        while i >= 0:
            marks.append(i)
            i = region.find(b'"error"', i + 7, stop)
        self.meter.defer(region)  # its text is counted when a cut stream's estimate needs it
        chars = 0
        last = -1  # the start of the last event decoded (one event may hold several marks)
        for i in sorted(marks):
            j = region.rfind(b"\n\n", 0, i)
            start = j + 2 if j >= 0 else 0
            if start == last:
                continue
            last = start
            ev = region[start:region.find(b"\n\n", i) + 2]
            chars -= sum(map(len, _TEXT.findall(ev)))  # the decoder counts this one's text itself
            self._track(self._decoder.feed(ev))
        if stop < n:
            self._track(self._decoder.feed(region[stop:]))
        self.meter.streamed_chars += chars
        return usage

    def _scan_events(self, region: bytes) -> bool:
        """`_scan` event by event: a region with events of other shapes (comments, fields, multi-line data)."""
        chars = sum(map(len, _TEXT.findall(region)))
        for ev in region.split(b"\n\n"):
            if not ev or (ev.startswith(b"data: {") and ev.endswith(b"}") and b"\n" not in ev
                          and b'"error"' not in ev and _USAGE.search(ev) is None):
                continue
            chars -= sum(map(len, _TEXT.findall(ev)))  # the decoder counts this one's text itself
            self._track(self._decoder.feed(ev + b"\n\n"))
        self.meter.streamed_chars += chars
        return True

    @staticmethod
    def _strip(region: bytes) -> bytes:
        if b"\r" not in region:  # LF line ends: look only at the events around `"choices":[]`
            return _strip_lf(region)
        out: list[bytes] = []
        start = 0
        for m in _EVENT_END.finditer(region):
            raw = region[start:m.end()]
            start = m.end()
            if not is_usage_chunk(raw):
                out.append(raw)
        rest = region[start:]
        if rest and not is_usage_chunk(rest):  # an unterminated last event (end of stream only)
            out.append(rest)
        return b"".join(out)

    def finish(self) -> bytes:
        """End of the upstream body: what is left, and an error event if the stream was cut."""
        tail, self._buf = self._buf, b""
        cut = self._track(self._decoder.feed(tail) + self._decoder.close())
        if not self.finished:
            self.meter.count()  # no end marker: the estimate may be charged
        out = self._strip(tail) if tail else b""
        if cut is not None:
            out += encode_event(openai.render_error(500, cut.message, cut.type))
        return out


def _strip_lf(region: bytes) -> bytes:
    """`region` (whole events, LF line ends) less its usage-only chunks, found from `"choices":[]`."""
    out: list[bytes] = []
    start = 0  # where the part not yet copied out begins
    for m in _NO_CHOICES.finditer(region):
        if m.start() < start:
            continue  # inside a chunk already cut
        ev_start = region.rfind(b"\n\n", start, m.start())
        ev_start = start if ev_start < 0 else ev_start + 2
        ev_end = region.find(b"\n\n", m.end())
        ev_end = len(region) if ev_end < 0 else ev_end + 2
        if is_usage_chunk(region[ev_start:ev_end]):
            out.append(region[start:ev_start])
            start = ev_end
    out.append(region[start:])
    return b"".join(out)
