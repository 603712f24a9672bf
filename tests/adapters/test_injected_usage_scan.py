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
