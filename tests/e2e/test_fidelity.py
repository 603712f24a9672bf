"""Protocol fidelity through a real Envoy and extproc: upstreams that replay recorded provider
traffic (tests/adapters/conformance/data), clients that are the official SDKs.

- an OpenAI client streaming from an OpenAI upstream without `include_usage` gets the upstream's
  bytes, less only the usage chunk the gateway asked for;
- a translated request reaches OpenAI with `max_completion_tokens` (or `max_tokens` where the
  deployment opts into the legacy field), and what OpenAI cannot express is a 400;
- Gemini 3 streamed call arguments and an Anthropic call without arguments reach an OpenAI client
  whole, as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from aiohttp import web

from adapters.injected_usage import is_usage_chunk
from tests.adapters.conformance.recorded import RECORDED, sse_from_chunks
from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.e2e

OPENAI_STREAM = RECORDED["aig-cassette-chat-streaming-detailed-usage.sse"]
GEMINI_STREAM = sse_from_chunks("gemini", RECORDED["vai-google-stream-no-args-tool-call.chunks.txt"])
ANTHROPIC_STREAM = sse_from_chunks("anthropic", RECORDED["vai-anthropic-tool-no-args.chunks.txt"])


class ReplayUpstream(ThreadedApp):
    """Answers every protocol with recorded bytes (streamed in small writes) and keeps each
    request body it got, on its own event loop in a thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._answer)
        super().__init__(app)

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append((request.path, body))
        if request.path.endswith(":streamGenerateContent"):
            stream: bytes | None = GEMINI_STREAM
        elif request.path == "/v1/messages":
            stream = ANTHROPIC_STREAM if body.get("stream") else None
        else:
            stream = OPENAI_STREAM if body.get("stream") else None
        if stream is None:
            return web.Response(body=RECORDED["vai-openai-text.json"], content_type="application/json")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(stream), 97):  # odd-sized writes: events split across reads
            await resp.write(stream[i:i + 97])
        await resp.write_eof()
        return resp


def _model(name: str, protocol: str, port: int, **extra: object) -> dict:
    return {"name": name, "capabilities": {"tools": True},
            "deployments": [{"cluster": name, "protocol": protocol, "endpoints": [f"127.0.0.1:{port}"], **extra}]}


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, ReplayUpstream]]:
    with ReplayUpstream() as up:
        data = small_config()
        data["models"] = [_model("fid-openai", "openai", up.port),
                          _model("fid-openai-legacy", "openai", up.port, max_tokens_field="max_tokens"),
                          _model("fid-gemini", "gemini", up.port), _model("fid-anthropic", "anthropic", up.port)]
        with start_stack(tmp_path_factory.mktemp("fidelity"), data, demos=False) as stack:
            yield stack, up


def _oai(stack: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=60)  # type: ignore[attr-defined]


def test_same_protocol_stream_is_the_upstreams_bytes_less_the_injected_usage(replay: tuple) -> None:
    stack, up = replay
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": "fid-openai", "stream": True,
                            "messages": [{"role": "user", "content": "hi"}]}) as r:
        got = b"".join(r.iter_bytes())
    assert r.status_code == 200
    events = [e + b"\n\n" for e in OPENAI_STREAM.split(b"\n\n") if e.strip()]
    assert got == b"".join(e for e in events if not is_usage_chunk(e))  # every other byte as sent
    assert up.seen[-1][1]["stream_options"] == {"include_usage": True}  # asked for, for metering
    # The SDK reads it, finish reason and the upstream's own fields intact, and no usage chunk.
    chunks = list(_oai(stack).chat.completions.create(model="fid-openai", stream=True,
                                                      messages=[{"role": "user", "content": "hi"}]))
    assert chunks[-1].choices[0].finish_reason == "length" and all(c.usage is None for c in chunks)
    assert chunks[0].service_tier == "default"


def test_translated_request_uses_max_completion_tokens_unless_legacy(replay: tuple) -> None:
    stack, up = replay
    claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0, timeout=60)
    for model, field in (("fid-openai", "max_completion_tokens"), ("fid-openai-legacy", "max_tokens")):
        msg = claude.messages.create(model=model, max_tokens=77, messages=[{"role": "user", "content": "a holiday"}])
        assert msg.content[0].text.startswith("**Holiday Name:** Galaxy Day")  # type: ignore[union-attr]
        assert (msg.stop_reason, msg.usage.input_tokens, msg.usage.output_tokens) == ("end_turn", 16, 363)
        sent = up.seen[-1][1]
        assert sent[field] == 77 and len({"max_tokens", "max_completion_tokens"} & set(sent)) == 1
    with pytest.raises(anthropic.BadRequestError, match="top_k"):
        claude.messages.create(model="fid-openai", max_tokens=5, messages=[{"role": "user", "content": "x"}],
                               extra_body={"top_k": 3})


def test_streamed_calls_reach_an_openai_client_whole(replay: tuple) -> None:
    stack, _ = replay
    oai = _oai(stack)
    with oai.chat.completions.stream(model="fid-gemini", messages=[{"role": "user", "content": "read"}]) as s:
        done = s.get_final_completion()
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in done.choices[0].message.tool_calls or []]
    assert calls == [("read_theme", {}), ("read_screen", {"id": "A"}), ("read_screen", {"id": "B"}),
                     ("read_screen", {"id": "C"})]
    assert done.choices[0].finish_reason == "tool_calls"
    with oai.chat.completions.stream(model="fid-anthropic", messages=[{"role": "user", "content": "update"}]) as s:
        done = s.get_final_completion()
    call = (done.choices[0].message.tool_calls or [])[0]
    assert (call.id, call.function.name, call.function.arguments) == ("toolu_01QE1WLsSVp5hy5Q3GmGTmjP",
                                                                      "updateIssueList", "{}")
