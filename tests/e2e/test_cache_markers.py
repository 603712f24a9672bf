"""Prompt-cache markers through a real Envoy (issue 39): the anthropic SDK's `cache_control` blocks
reach a Bedrock deployment as Converse `cachePoint`s, and the caller gets the cache's tokens back
in its own fields, 1-hour writes apart. The Bedrock demo caches only what a cachePoint marks
(devstack/demo/behaviour.py): a last user message saying "cache-hit" ("cache-write") reports every
input word before it as read from (written to) the cache, only when a marker arrived. Also: an
Anthropic caller of a Gemini stream sees the prompt's tokens in message_start."""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_cache
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

PREFIX = "You answer questions about the long shared prefix below"  # 9 words: what the marker caches
MARKED = [{"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral"}}]
MARKED_1H = [{"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
WORDS = 9


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("cache-markers")
    data, _ = demo_config_free_ports()
    data.pop("ratelimit", None)
    data["models"] = [m for m in data["models"] if m["name"] in ("demo-bedrock", "demo-gemini")]
    for m in data["models"]:
        m["deployments"] = m["deployments"][:1]
        d = m["deployments"][0]
        d.pop("watermark", None)
        if "bedrock" in d:  # the demo writes its credentials file there
            d["bedrock"] = {**d["bedrock"], "credentials_file": str(workdir / "bedrock-credentials")}
    with start_stack(workdir, data, shared_demos=True) as s:
        yield s


@pytest.fixture(scope="module")
def claude(stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)


def test_a_marked_system_prompt_reaches_bedrock_and_its_cache_read_comes_back(claude) -> None:
    msg = claude.messages.create(model="demo-bedrock", max_tokens=64, system=MARKED,  # type: ignore[arg-type]
                                 messages=[{"role": "user", "content": "cache-hit please"}])
    assert msg.content[0].text.startswith("[demo-bedrock]")
    u = msg.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (2, WORDS, 0)


def test_without_a_marker_bedrock_caches_nothing(claude) -> None:
    msg = claude.messages.create(model="demo-bedrock", max_tokens=64, system=PREFIX,
                                 messages=[{"role": "user", "content": "cache-hit please"}])
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens or 0) == (WORDS + 2, 0)


def test_a_marker_on_an_earlier_turn_streamed(claude) -> None:
    with claude.messages.stream(model="demo-bedrock", max_tokens=64, messages=[
            {"role": "user", "content": [{"type": "text", "text": PREFIX, "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "cache-hit please"}]) as s:
        msg = s.get_final_message()
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens) == (2, WORDS + 1)


def test_a_one_hour_marker_is_written_and_priced_as_a_one_hour_write(claude, stack) -> None:
    raw = claude.messages.with_raw_response.create(
        model="demo-bedrock", max_tokens=64, system=MARKED_1H,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "cache-write please"}])
    u = raw.parse().usage
    assert (u.input_tokens, u.cache_creation_input_tokens) == (2, WORDS)
    assert u.cache_creation is not None
    assert (u.cache_creation.ephemeral_1h_input_tokens, u.cache_creation.ephemeral_5m_input_tokens) == (WORDS, 0)
    tin, read, write, write_1h, _cost, _saved = metered_cache(stack, raw.headers["x-modelyard-task-id"])
    assert (tin, read, write, write_1h) == (WORDS + 2, 0, WORDS, WORDS)


def test_an_anthropic_stream_from_gemini_reports_the_prompt_in_message_start(claude) -> None:
    events = list(claude.messages.create(model="demo-gemini", max_tokens=64, stream=True, system=PREFIX,
                                         messages=[{"role": "user", "content": "count me"}]))
    start = events[0]
    assert start.type == "message_start"
    assert start.message.usage.input_tokens == WORDS + 2  # Gemini's first chunk already counts the prompt
