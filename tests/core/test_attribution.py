"""Who a failure is held against, and what an aborted stream is charged: driven through a Session."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import yaml

from adapters.internal import TextDelta, ToolCallDelta, UsageUpdate
from adapters.stream_usage import StreamUsage
from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.session import Session
from extproc.telemetry.metering import MeteringStore
from tests.core.session_driver import ROOT, ROUTES, body_msg, chat_headers, headers_msg
from tests.stack_config import without_watermarks

SSE = {":status": "200", "content-type": "text/event-stream"}


def _gateway(tmp_path: Path) -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    return Gateway.build(parse_config(data), metering=MeteringStore(tmp_path / "m.sqlite"))


def _chunk(text: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                     "choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"


async def _stream(gw: Gateway, model: str, chunks: list[bytes], *, end: bool, status: str = "200") -> None:
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    await s.handle(body_msg(orjson.dumps({"model": model, "stream": True, "max_tokens": 1000,
                                          "messages": [{"role": "user", "content": "x" * 400}]})))
    await s.handle(headers_msg({**SSE, ":status": status}, response=True))
    for i, c in enumerate(chunks):
        await s.handle(body_msg(c, response=True, eos=end and i == len(chunks) - 1))
    s.close()


def _feedback(gw: Gateway, cluster: str) -> tuple[int, float]:
    """(upstream outcomes recorded, error-rate EWMA) for a cluster."""
    stats = gw.dispatcher.scheduler.feedback.get(cluster)
    return (stats.requests, stats.error_rate) if stats else (0, 0.0)


async def test_a_client_that_leaves_mid_stream_is_charged_what_streamed_and_cools_nothing(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    for _ in range(10):  # far past any cooldown threshold
        await _stream(gw, "demo-gpt", [_chunk("a" * 40), _chunk("b" * 40)], end=False)
    assert gw.dispatcher.scheduler.feedback.stats == {}  # no deployment heard anything against it
    await gw.close()
    with sqlite3.connect(tmp_path / "m.sqlite") as conn:
        rows = conn.execute("SELECT status, input_tokens, output_tokens FROM requests").fetchall()
    assert len(rows) == 10
    # The prompt estimate (400 chars ~ 100 tokens + overhead) and 80 streamed chars (20 tokens).
    assert all(status == 499 and tin >= 100 and tout == 20 for status, tin, tout in rows), rows


async def test_an_upstream_5xx_counts_against_its_deployment(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    s = Session(gw, ROUTES)
    await s.handle(headers_msg(chat_headers()))
    await s.handle(body_msg(orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})))
    await s.handle(headers_msg({":status": "503", "content-type": "application/json"}, response=True))
    await s.handle(body_msg(b'{"error": {"message": "down"}}', response=True))
    s.close()
    requests, error_rate = _feedback(gw, "demo-openai")
    assert requests == 1 and error_rate > 0
    await gw.close()


def test_stream_usage_prefers_reported_counts_and_estimates_the_rest() -> None:
    u = StreamUsage()
    u.observe([TextDelta("abcdefgh"), ToolCallDelta(0, '{"a":1}'), UsageUpdate(input_tokens=7)])
    assert (u.partial(99).input_tokens, u.partial(99).output_tokens) == (7, 4)  # 15 chars -> 4 tokens
    u.observe([UsageUpdate(output_tokens=50)])
    assert u.partial(99).output_tokens == 50
    assert (u.reported.input_tokens, u.reported.output_tokens) == (7, 50)


def _anthropic_events(text: str, output_tokens: int) -> list[bytes]:
    def ev(name: str, data: dict) -> bytes:
        return f"event: {name}\ndata: ".encode() + orjson.dumps({"type": name, **data}) + b"\n\n"
    return [ev("message_start", {"message": {"id": "m1", "type": "message", "role": "assistant", "model": "m",
                                             "content": [], "usage": {"input_tokens": 7, "output_tokens": 1}}}),
            ev("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            + ev("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": text}}),
            ev("content_block_stop", {"index": 0})
            + ev("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": output_tokens}})
            + ev("message_stop", {})]


async def test_a_client_that_hangs_up_after_the_whole_answer_is_metered_as_the_upstream_counted(tmp_path: Path) -> None:
    # The client read the upstream's end ([DONE], message_stop) and closed before Envoy's empty
    # end-of-stream message reached the extproc: a complete call, at the upstream's own counts.
    gw = _gateway(tmp_path)
    done = [_chunk("a" * 80), b"data: " + orjson.dumps({
        "id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}) + b"\n\ndata: [DONE]\n\n"]
    await _stream(gw, "demo-gpt", done, end=False)  # passed through as sent
    await _stream(gw, "demo-claude", _anthropic_events("b" * 80, 3), end=False)  # translated to chat
    await gw.close()
    with sqlite3.connect(tmp_path / "m.sqlite") as conn:
        rows = conn.execute("SELECT model, status, input_tokens, output_tokens FROM requests ORDER BY model").fetchall()
    assert rows == [("demo-claude", 200, 7, 3), ("demo-gpt", 200, 7, 3)]
