"""The chat calls' bodies in full duplex (`extproc.bodies: duplex`, extproc/duplex.py) through a real Envoy,
beside the buffered design: real SDKs with their default headers, a stream, a translation, the Responses
API, a refusal and a body past the buffer in the caller's protocol; and Envoy's own counters say which
design each call took."""

from __future__ import annotations

import os
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from bench.bench_gateway import _config, extproc_stats
from controlplane.environments import EnvironmentConfig
from tests.conftest import UPSTREAM_KEYS
from tests.stack_config import start_stack

pytestmark = pytest.mark.e2e
KEY = "sk-modelyard-demo"  # the bench tenant's key (bench/bench_gateway.py)
BUFFER = 256 * 1024


def _one_unary_call(stack, oai: openai.OpenAI) -> int:
    """Messages Envoy sent the extproc for one unary chat call."""
    before = extproc_stats(stack)
    chat = oai.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "counted"}])
    assert chat.choices[0].message.content == "[demo-openai] echo: counted"
    after = extproc_stats(stack)
    assert after["streams_started"] - before["streams_started"] == 1
    return after["stream_msgs_sent"] - before["stream_msgs_sent"]


@pytest.mark.parametrize("bodies", ["duplex", "buffered"])
def test_chat_calls_in_either_design(tmp_path: Path, bodies: str) -> None:
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    data = _config()
    data["extproc"]["bodies"] = bodies
    env = EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1,
                            buffer_limit_bytes=BUFFER)
    with start_stack(tmp_path, data, env) as stack:
        oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
        sent = _one_unary_call(stack, oai)
        # buffered: headers and body each way, each answered before the next; duplex: each body's data and its
        # end as well, sent without waiting (HTTP/1.1 ends a body with an empty message)
        assert sent == (4 if bodies == "buffered" else 6), sent
        chunks = list(oai.chat.completions.create(model="demo-gpt", stream=True, stream_options={"include_usage": True},
                                                  messages=[{"role": "user", "content": "streamed"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "[demo-openai] echo: streamed"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
        ant = anthropic.Anthropic(base_url=stack.url, api_key=KEY, max_retries=0)
        msg = ant.messages.create(model="demo-gpt", max_tokens=16, messages=[{"role": "user", "content": "translated"}])
        assert msg.content[0].text == "[demo-openai] echo: translated" and msg.usage.output_tokens > 0
        with ant.messages.stream(model="demo-gpt", max_tokens=16,
                                 messages=[{"role": "user", "content": "translated stream"}]) as s:
            assert "".join(s.text_stream) == "[demo-openai] echo: translated stream"
        resp = oai.responses.create(model="demo-gpt", input="responses api")
        assert resp.output_text == "[demo-openai] echo: responses api"
        with pytest.raises(openai.NotFoundError):
            oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=stack.url, api_key="sk-wrong", max_retries=0).messages.create(
                model="demo-gpt", max_tokens=16, messages=[{"role": "user", "content": "x"}])
        # past the buffer: a 413 in the caller's own protocol, whoever refuses it (Envoy's buffer or the extproc)
        big = "x" * (BUFFER + 1024)
        with pytest.raises(anthropic.APIStatusError) as e:
            ant.messages.create(model="demo-gpt", max_tokens=16, messages=[{"role": "user", "content": big}])
        assert e.value.status_code == 413 and e.value.body["type"] == "error"
        # a plain client that asks for no compression gets the same answer; calls after the refusals still go
        plain = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                           json={"model": "demo-gpt", "messages": [{"role": "user", "content": "after"}]}, timeout=10)
        assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"] == \
            "[demo-openai] echo: after"
        assert _one_unary_call(stack, oai) == sent
        log = (stack.log_dir / "extproc.log").read_text()
    assert "Traceback" not in log
