"""Protocol translation cost: OpenAI client -> Anthropic upstream, per request and per stream chunk.

    .venv/bin/python bench/bench_translation.py [--quick]

Baseline in the same run: orjson.loads + orjson.dumps of the same bytes (the floor any JSON rewrite
pays); for the recorded-stream passthrough, re-encoding the stream through the internal format. Reports medians (us) over many timed batches; the last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters import anthropic, openai  # noqa: E402
from adapters.injected_usage import InjectedUsageFilter  # noqa: E402
from adapters.registry import StreamTranslator, translate_stream  # noqa: E402
from bench.smoke import scaled  # noqa: E402

GOAL_1KB_US = 50.0


def _request(target_bytes: int) -> bytes:
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather by city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}}}}}]
    msgs: list[dict] = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    base = {"model": "chat-model", "messages": msgs, "tools": tools, "temperature": 0.7, "max_tokens": 256}
    sentence = "The quick brown fox jumps over the lazy dog while the gateway translates. "
    i = 0
    while len(orjson.dumps(base)) < target_bytes:
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": sentence * 2 + f"(turn {i})"})
        i += 1
    if msgs[-1]["role"] != "user":
        msgs.append({"role": "user", "content": "and then?"})
    return orjson.dumps(base)


def _median_us(fn: Callable[[], object], batches: int, per_batch: int) -> float:
    for _ in range(per_batch):  # warm up
        fn()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter_ns() - t0) / per_batch / 1000)
    return statistics.median(samples)


def main() -> None:
    quick = "--quick" in sys.argv
    scale = scaled(0.2 if quick else 1.0, 0.0)
    rows: list[dict] = []
    table: list[tuple[str, float, float]] = []

    def record(case: str, fn: Callable[[], object], base: Callable[[], object], batches: int, per: int) -> float:
        b, p = max(5, int(batches * scale)), scaled(per, max(1, per // 20))
        us = _median_us(fn, b, p)
        bus = _median_us(base, b, p)
        rows.append({"bench": "translation", "case": case, "metric": "median_latency", "value": round(us, 3),
                     "unit": "us", "baseline": round(bus, 3), "ratio": round(us / bus, 2)})
        table.append((case, us, bus))
        return us

    for label, size, batches, per in (("1KB", 1024, 300, 200), ("100KB", 100 * 1024, 60, 10)):
        raw = _request(size)

        def translate(raw: bytes = raw) -> bytes:
            req = openai.parse_request(raw)
            return anthropic.render_request(req, upstream_model="claude-up", credential="sk").body

        def baseline(raw: bytes = raw) -> bytes:
            return orjson.dumps(orjson.loads(raw))

        record(f"request_{label}_openai_to_anthropic ({len(raw)} B)", translate, baseline, batches, per)

    resp = orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-up",
                         "content": [{"type": "text", "text": "Hello there, " * 40}], "stop_reason": "end_turn",
                         "stop_sequence": None, "usage": {"input_tokens": 300, "output_tokens": 120}})
    record("response_anthropic_to_openai",
           lambda: openai.render_response(anthropic.parse_response(resp), model="chat-model"),
           lambda: orjson.dumps(orjson.loads(resp)), 300, 200)

    req = openai.parse_request(_request(1024))
    data = orjson.dumps({"type": "content_block_delta", "index": 0,
                         "delta": {"type": "text_delta", "text": "Hello there"}})
    chunk = b"event: content_block_delta\ndata: " + data + b"\n\n"
    tr = translate_stream("anthropic", "openai", req)
    tr.feed(b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"c",'
            b'"usage":{"input_tokens":3,"output_tokens":1}}}\n\n')
    record("stream_chunk_anthropic_to_openai", lambda: tr.feed(chunk), lambda: orjson.dumps(orjson.loads(data)),
           300, 500)

    # A recorded OpenAI stream (300 chunks, ~100 KB) to an OpenAI client that did not ask for usage:
    # the upstream's bytes less the injected usage chunk, against re-encoding it (the old path).
    recorded = (ROOT / "tests/adapters/conformance/data/vai-openai-text.chunks.txt").read_bytes()
    stream = b"".join(b"data: " + ln + b"\n\n" for ln in recorded.splitlines() if ln.strip()) + b"data: [DONE]\n\n"
    reads = [stream[i:i + 512] for i in range(0, len(stream), 512)]

    def drive(make: Callable[[], InjectedUsageFilter | StreamTranslator]) -> None:
        f = make()
        for r in reads:
            f.feed(r)
        f.finish()

    record(f"stream_openai_passthrough_less_usage ({len(stream)} B)", lambda: drive(InjectedUsageFilter),
           lambda: drive(lambda: translate_stream("openai", "openai", req)), 40, 5)

    print(f"{'case':<52} {'median us':>10} {'baseline us':>12} {'ratio':>7}")
    for case, us, bus in table:
        print(f"{case:<52} {us:>10.2f} {bus:>12.2f} {us / bus:>7.1f}")
    one_kb = table[0][1]
    print(f"goal: 1 KB request under {GOAL_1KB_US:.0f} us -> {'met' if one_kb < GOAL_1KB_US else 'MISSED'}")
    print("SUMMARY " + orjson.dumps(rows).decode())


if __name__ == "__main__":
    main()
