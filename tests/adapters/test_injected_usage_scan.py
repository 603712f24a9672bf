"""InjectedUsageFilter meters by byte scans: what it skips parsing must not change what it meters."""

from __future__ import annotations

import orjson

from adapters.injected_usage import InjectedUsageFilter


def _chunk(delta: dict, usage: dict | None = None, choices: bool = True) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": delta, "finish_reason": None}] if choices else [], "usage": usage}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


TEXTS = ["Hel", 'lo "quoted"', " wor\\ld", "é!"]
CONTENT = [_chunk({"content": t}) for t in TEXTS]
USAGE = _chunk({}, {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}, choices=False)


def _run(raw: bytes, step: int) -> tuple[InjectedUsageFilter, bytes]:
    f = InjectedUsageFilter()
    out = b"".join(f.feed(raw[i:i + step]) for i in range(0, len(raw), step)) + f.finish()
    return f, out


def test_a_cut_stream_is_charged_for_the_text_that_passed_unparsed() -> None:
    for step in (1, 7, 10_000):
        f, out = _run(b"".join(CONTENT), step)  # no usage, no [DONE]: the upstream stopped
        assert f.error is not None and b'"error"' in out
        # The JSON text of each delta, escapes included: the estimate StreamUsage.partial charges.
        assert f.meter.streamed_chars == sum(len(orjson.dumps(t)) - 2 for t in TEXTS)
        assert f.meter.partial(99).input_tokens == 99 and f.meter.partial(99).output_tokens > 0


def test_usage_on_a_content_chunk_is_read_and_the_chunk_kept() -> None:
    last = _chunk({"content": "!"}, {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5})
    raw = b"".join(CONTENT) + last + b"data: [DONE]\n\n"
    f, out = _run(raw, 5)
    assert out == raw  # not a usage-only chunk: nothing removed
    assert f.finished and f.error is None
    assert (f.meter.reported.input_tokens, f.meter.reported.output_tokens) == (3, 2)


def test_the_usage_only_chunk_is_removed_between_others_and_metered() -> None:
    raw = b"".join(CONTENT) + USAGE + b"data: [DONE]\n\n"
    for step in (1, 13, 10_000):
        f, out = _run(raw, step)
        assert out == b"".join(CONTENT) + b"data: [DONE]\n\n"
        assert (f.meter.reported.input_tokens, f.meter.reported.output_tokens) == (7, 4)


def test_an_error_event_mid_stream_is_seen() -> None:
    error = b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
    f, out = _run(CONTENT[0] + error, 10_000)
    assert f.error is not None and "overloaded" in f.error
    assert out.startswith(CONTENT[0] + error)


def _tool_chunk(args: str) -> bytes:
    return _chunk({"tool_calls": [{"index": 0, "function": {"arguments": args}}]})


DONE = b"data: [DONE]\n\n"
FINISH = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,' \
         b'"delta":{},"finish_reason":"stop"}],"usage":null}\n\n'
ERROR = b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
# Streams of every shape the region-wide scan must read as the event-by-event one does.
STREAMS = {
    "whole": b"".join(CONTENT) + FINISH + USAGE + DONE,
    "tools": b"".join(CONTENT[:2]) + _tool_chunk('{"city":') + _tool_chunk('"Pa\\"ris"}') + FINISH + USAGE + DONE,
    "error mid-stream": b"".join(CONTENT[:2]) + ERROR + b"".join(CONTENT[2:]),
    "usage on a content chunk": b"".join(CONTENT) + _chunk({"content": "!"}, {"prompt_tokens": 3,
                                                                            "completion_tokens": 2}) + DONE,
    "a comment between chunks": b"".join(CONTENT[:2]) + b": keep-alive\n\n" + b"".join(CONTENT[2:]) + USAGE + DONE,
    "multi-line data": CONTENT[0] + b'data: {"id":"c","choices":[{"index":0,\ndata: "delta":{"content":"x"}}]}\n\n'
                       + USAGE + DONE,
    "cut": b"".join(CONTENT * 3),
    "[DONE] alone": DONE,
}


def _reference(raw: bytes) -> InjectedUsageFilter:
    """The same stream read event by event (`_scan_events`, the path for any event shape)."""
    f = InjectedUsageFilter()
    end = raw.rfind(b"\n\n") + 2
    f._scan_events(raw[:end])
    f.finish()
    return f


def test_the_region_wide_scan_meters_as_the_event_by_event_one() -> None:
    for name, raw in STREAMS.items():
        want = _reference(raw)
        outs = set()
        for step in (1, 7, 64, 333, len(raw)):
            f, out = _run(raw, step)
            outs.add(out)
            f.meter.count()  # a stream that ended whole has not counted its text: nothing charges it
            got = (f.meter.streamed_chars, f.meter.input_tokens, f.meter.output_tokens, f.meter.ended, f.finished,
                   f.error)
            assert got == (want.meter.streamed_chars, want.meter.input_tokens, want.meter.output_tokens,
                           want.meter.ended, want.finished, want.error), (name, step)
        assert len(outs) == 1, name  # the same bytes out however the stream arrives
        out, body = outs.pop(), raw.replace(USAGE, b"")  # the usage-only chunk cut, nothing else
        # A stream cut without its end marker (nor an error of its own) gets an error event after what passed.
        cut = not want.finished and b'"error"' not in raw
        assert out == body if not cut else out.startswith(body) and b'"error"' in out[len(body):], name


def test_one_region_with_the_whole_stream_reads_its_usage_and_end() -> None:
    f = InjectedUsageFilter()
    out = f.feed(STREAMS["whole"])
    assert out == b"".join(CONTENT) + FINISH + DONE
    assert f.finished and f.error is None
    assert (f.meter.input_tokens, f.meter.output_tokens) == (7, 4)
    f.meter.count()
    assert f.meter.streamed_chars == sum(len(orjson.dumps(t)) - 2 for t in TEXTS)


def test_a_long_cut_stream_is_charged_for_all_its_text() -> None:
    raw = b"".join(CONTENT) * 2000  # past the text the meter lets wait uncounted
    want = 2000 * sum(len(orjson.dumps(t)) - 2 for t in TEXTS)
    for step in (4096, 10_000, len(raw)):
        f, _ = _run(raw, step)
        assert f.meter.streamed_chars == want
    f = InjectedUsageFilter()
    for i in range(0, len(raw), 5000):
        f.feed(raw[i:i + 5000])
    # The client hung up before the end (no finish): the estimate counts what waited as well.
    assert (f.meter.partial(9).input_tokens, f.meter.partial(9).output_tokens) == (9, -(-want // 4))
