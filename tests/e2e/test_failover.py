"""Failover across protocols inside one request: the chosen deployment is down, Envoy retries on
a peer that speaks another protocol through a translation hop, and the client never notices."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
PINNED = {"x-modelyard-strategy": "pinned"}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory):
    data = small_config()
    data["models"] = [{"name": "mixed", "capabilities": {"tools": True}, "deployments": [
        # Nobody listens here: every attempt fails to connect.
        {"cluster": "dead-openai", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"]},
        {"cluster": "demo-mixed-anthropic", "protocol": "anthropic", "endpoints": [f"127.0.0.1:{free_port()}"]},
    ]}]
    for t in data["tenants"]:
        t["allowed_models"] = ["*"]
    # A quality-only strategy ties the two; config order puts the dead one first.
    data["routing"] = {"strategies": {"pinned": {"quality": 1}}}
    with start_stack(tmp_path_factory.mktemp("mixed"), data) as stack:
        yield stack


@pytest.fixture
def fresh(mixed):
    """A new extproc: a scheduler that has not yet learnt the dead deployment is dead, so the
    request under test really starts there and fails over inside Envoy."""
    mixed.restart("extproc")
    return mixed


def test_plain_request_fails_over_to_another_protocol(fresh) -> None:
    r = httpx.post(f"{fresh.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}", **PINNED},
                   json={"model": "mixed", "messages": [{"role": "user", "content": "are you there"}]}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == "[demo-mixed-anthropic] echo: are you there"
    assert r.headers["x-modelyard-cluster"] == "demo-mixed-anthropic"  # who really answered


def test_stream_fails_over_with_the_openai_sdk(fresh) -> None:
    client = openai.OpenAI(base_url=f"{fresh.url}/v1", api_key=DEMO_KEY, max_retries=0, default_headers=PINNED)
    chunks = list(client.chat.completions.create(model="mixed", stream=True,
                                                 messages=[{"role": "user", "content": "stream it over"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "[demo-mixed-anthropic] echo: stream it over"


def test_tool_call_fails_over_with_the_openai_sdk(fresh) -> None:
    client = openai.OpenAI(base_url=f"{fresh.url}/v1", api_key=DEMO_KEY, max_retries=0, default_headers=PINNED)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
    out = client.chat.completions.create(model="mixed", tools=[tool],
                                         messages=[{"role": "user", "content": "weather in Lima"}])
    assert json.loads(out.choices[0].message.tool_calls[0].function.arguments) == {"city": "Lima"}


def test_anthropic_client_fails_over_through_two_translations(fresh) -> None:
    client = anthropic.Anthropic(base_url=fresh.url, api_key=DEMO_KEY, max_retries=0, default_headers=PINNED)
    msg = client.messages.create(model="mixed", max_tokens=50, messages=[{"role": "user", "content": "hop hop"}])
    assert msg.content[0].text == "[demo-mixed-anthropic] echo: hop hop"
    assert msg.stop_reason == "end_turn"


def test_failover_is_metered_against_the_deployment_that_answered(fresh) -> None:
    httpx.post(f"{fresh.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}", **PINNED},
               json={"model": "mixed", "messages": [{"role": "user", "content": "meter me"}]}, timeout=10)
    text = httpx.get(f"http://{fresh.cfg.extproc.metrics_address}/metrics").text
    assert 'modelyard_requests_total{cluster="demo-mixed-anthropic",model="mixed",status="200"}' in text
    assert 'cluster="dead-openai",model="mixed",status="200"' not in text


def test_envoy_went_through_the_translation_hop(fresh) -> None:
    # Its own call (not the module's earlier ones: run alone, or on another worker, it has only this).
    def counts() -> dict[str, int]:
        stats = httpx.get(f"{fresh.admin_url()}/stats?filter=upstream_rq_total").text
        return {ln.split(":")[0]: int(ln.split(":")[1]) for ln in stats.splitlines() if ":" in ln}

    hop = "cluster.xlate~openai~demo-mixed-anthropic.upstream_rq_total"
    before = counts().get(hop, 0)
    r = httpx.post(f"{fresh.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}", **PINNED},
                   json={"model": "mixed", "messages": [{"role": "user", "content": "hop"}]}, timeout=10)
    assert r.status_code == 200, r.text
    after = counts()
    assert after[hop] == before + 1
    assert after.get("cluster.dead-openai.upstream_rq_total", 0) == 0  # connects failed: no request went out
