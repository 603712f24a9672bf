"""The simulated fleet's server as its callers see it: the `openai` SDK (unary and streamed), the
picker's own vLLM parser on its /metrics, and a prefix hit reported back in the usage."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from extproc.replicas.readings import parse_vllm
from tests.stack_config import ROOT, free_port

SYSTEM = "You are the fleet test's assistant. " * 40  # about 360 tokens: 22 full blocks


@pytest.fixture(scope="module")
def fleet() -> Iterator[list[str]]:
    ports = [free_port(), free_port()]
    proc = subprocess.Popen([sys.executable, "-m", "devstack.fleet.server", "--ports", ",".join(map(str, ports)),
                             "--decode-base-ms", "2", "--flush-ms", "20"], cwd=ROOT)
    eps = [f"127.0.0.1:{p}" for p in ports]
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://{eps[-1]}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, "fleet did not start"
                time.sleep(0.1)
        yield eps
    finally:
        proc.terminate()
        proc.wait(10)


def test_unary_and_streamed_chat_with_a_prefix_hit(fleet: list[str]) -> None:
    ep = fleet[0]
    client = openai.OpenAI(base_url=f"http://{ep}/v1", api_key="none", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
    raw = client.chat.completions.with_raw_response.create(model="sim-llama", messages=messages,  # type: ignore
                                                           max_tokens=12)
    first = raw.parse()
    assert raw.headers["x-fleet-replica"] == ep
    assert first.usage is not None and first.usage.completion_tokens == 12
    assert first.choices[0].message.content == " t" * 12 and first.choices[0].finish_reason == "length"
    assert first.usage.prompt_tokens_details is not None and first.usage.prompt_tokens_details.cached_tokens == 0
    # the same system prompt again: its blocks are cached
    messages[1]["content"] = "second"
    stream = client.chat.completions.create(model="sim-llama", messages=messages, max_tokens=30,  # type: ignore
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " t" * 30
    assert chunks[0].choices[0].delta.content == " t"  # the first token alone
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens >= len(SYSTEM) // 4 - 16
    stats = httpx.get(f"http://{ep}/stats").json()
    assert stats["finished"] == 2 and stats["prefix_hits"] == usage.prompt_tokens_details.cached_tokens


def test_metrics_read_by_the_pickers_vllm_parser(fleet: list[str]) -> None:
    ep = fleet[1]
    body = httpx.get(f"http://{ep}/metrics").content
    reading = parse_vllm(body, now=1.0)
    assert (reading.waiting, reading.running, reading.kv_usage) == (0, 0, 0.0)
    for name in (b"vllm:num_preemptions_total", b"vllm:prefix_cache_hits_total", b"vllm:prefix_cache_queries_total",
                 b"vllm:time_to_first_token_seconds_bucket"):
        assert name in body


def test_bad_input_is_a_400_in_openais_shape(fleet: list[str]) -> None:
    ep = fleet[1]
    r = httpx.post(f"http://{ep}/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"http://{ep}/v1/chat/completions", json={"messages": [], "max_tokens": -1})
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    # A prompt no KV cache could hold: refused as vLLM refuses one past max_model_len (it once spun the loop).
    r = httpx.post(f"http://{ep}/v1/completions", json={"prompt": "x" * 4 * 20_000, "max_tokens": 8})
    assert r.status_code == 400 and "maximum context length is 16383 tokens" in r.json()["error"]["message"]
    r = httpx.post(f"http://{ep}/v1/completions", json={"prompt": "still answering", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == " t t"
