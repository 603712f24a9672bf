"""Prompt-cache usage through a real Envoy (issue 39): a caller whose call was translated sees the
upstream's cached tokens in its own protocol's fields, plain and streamed, and the metering row
prices them at the cached rate. The demo upstreams report a cache hit when the last user message
says "cache-hit" (devstack/demo/behaviour.py): every input word before it was read from the cache."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_cache
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

SYSTEM = "You answer questions about the long shared prefix below"  # 9 words: the cached prefix
ASK = "cache-hit please"  # 2 words, uncached
IN, READ = 11, 9
# USD per 1k: demo-gpt's own prices; demo-claude takes the shipped table's claude-sonnet-4-5 entry.
GPT_IN, GPT_CACHED, GPT_OUT = 2.5, 1.25, 10.0
SONNET_IN, SONNET_CACHED, SONNET_OUT = 0.003, 0.0003, 0.015


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    data, _ = demo_config_free_ports()
    data.pop("ratelimit", None)
    data["models"] = [m for m in data["models"] if m["name"] in ("demo-gpt", "demo-claude")]
    for m in data["models"]:
        m["deployments"] = m["deployments"][:1]
        m["deployments"][0].pop("watermark", None)
        m["deployments"][0].pop("api_key_env", None)
    data["models"][0]["cost"] = {"input_per_1k": GPT_IN, "output_per_1k": GPT_OUT, "cached_input_per_1k": GPT_CACHED}
    data["models"][1]["cost"] = {"table": "claude-sonnet-4-5"}
    with start_stack(tmp_path_factory.mktemp("prompt-cache"), data) as s:
        yield s


def _claude(stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)


def _oai(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def _priced(stack, task_id: str, output: int, price_in: float, price_cached: float, price_out: float) -> None:
    tin, read, write, write_1h, cost, saved = metered_cache(stack, task_id)
    assert (tin, read, write, write_1h) == (IN, READ, 0, 0)
    assert cost == pytest.approx(((IN - READ) * price_in + READ * price_cached + output * price_out) / 1000)
    assert saved == pytest.approx(READ * (price_in - price_cached) / 1000)


def test_anthropic_caller_of_an_openai_upstream_sees_cache_reads_outside_input_tokens(stack) -> None:
    raw = _claude(stack).messages.with_raw_response.create(
        model="demo-gpt", max_tokens=64, system=SYSTEM, messages=[{"role": "user", "content": ASK}])
    msg = raw.parse()
    assert msg.content[0].text.startswith("[demo-openai]")  # translated: OpenAI answered
    u = msg.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (IN - READ, READ, 0)
    _priced(stack, raw.headers["x-modelyard-task-id"], u.output_tokens, GPT_IN, GPT_CACHED, GPT_OUT)


def test_anthropic_caller_streamed(stack) -> None:
    with _claude(stack).messages.stream(model="demo-gpt", max_tokens=64, system=SYSTEM,
                                        messages=[{"role": "user", "content": ASK}]) as s:
        task_id = s.response.headers["x-modelyard-task-id"]
        msg = s.get_final_message()
    u = msg.usage
    assert (u.input_tokens, u.cache_read_input_tokens) == (IN - READ, READ)
    _priced(stack, task_id, u.output_tokens, GPT_IN, GPT_CACHED, GPT_OUT)


def test_openai_caller_of_an_anthropic_upstream_sees_cached_tokens_inside_prompt_tokens(stack) -> None:
    raw = _oai(stack).chat.completions.with_raw_response.create(
        model="demo-claude", messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}])
    c = raw.parse()
    assert c.choices[0].message.content.startswith("[demo-anthropic]")
    assert c.usage is not None and c.usage.prompt_tokens_details is not None
    assert (c.usage.prompt_tokens, c.usage.prompt_tokens_details.cached_tokens) == (IN, READ)
    _priced(stack, raw.headers["x-modelyard-task-id"], c.usage.completion_tokens, SONNET_IN, SONNET_CACHED, SONNET_OUT)


def test_openai_caller_streamed(stack) -> None:
    raw = _oai(stack).chat.completions.with_raw_response.create(
        model="demo-claude", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": ASK}])
    usage = [chunk.usage for chunk in raw.parse() if chunk.usage is not None]
    assert len(usage) == 1 and usage[0].prompt_tokens_details is not None
    assert (usage[0].prompt_tokens, usage[0].prompt_tokens_details.cached_tokens) == (IN, READ)
    _priced(stack, raw.headers["x-modelyard-task-id"], usage[0].completion_tokens, SONNET_IN, SONNET_CACHED, SONNET_OUT)
