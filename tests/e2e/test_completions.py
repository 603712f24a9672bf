"""POST /v1/completions through a real Envoy with the openai SDK's `client.completions.create`,
whole and streamed: passed through to replicas that serve it (the replica picker chooses, prefix
affinity on the prompt), translated to one chat turn for chat-only deployments (OpenAI's and
Anthropic's), a 400 in OpenAI's shape for what a turn cannot carry; metered, limited, audited."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.metered import metered_row
from tests.stack_config import free_port, small_config, start_stack

KEY = "sk-modelyard-demo"
LIMITED = "sk-modelyard-demo-limited"
STORY = "Once upon a time, in a gateway far away, every prompt began the same long way. " * 10  # several blocks


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    sim = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    data = small_config()
    data["models"] = [
        {"name": "sim", "task_types": ["chat", "completion"], "deployments": [{
            "cluster": "demo-sim", "protocol": "openai", "endpoints": sim,
            "replica_metrics": {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 400}}]},
        {"name": "chatty", "deployments": [{"cluster": "demo-chatty", "protocol": "openai",
                                            "endpoints": [f"127.0.0.1:{free_port()}"]}]},
        {"name": "claude-ish", "deployments": [{"cluster": "demo-claude", "protocol": "anthropic",
                                                "endpoints": [f"127.0.0.1:{free_port()}"]}]},
    ]
    data["extproc"]["audit_db"] = "audit.sqlite"
    data["extproc"]["metering_db"] = "metering.sqlite"
    data["ratelimit"] = {"backend": "memory", "limits": [
        {"scope": "tenant", "match": "demo-limited", "unit": "requests", "rate": 0.001, "burst": 2}]}
    with start_stack(tmp_path_factory.mktemp("completions"), data, shared_demos=True) as s:
        s.sim = sim
        s.chatty = data["models"][1]["deployments"][0]["endpoints"][0]
        yield s


def _client(stack: Any, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


def _paths(ep: str) -> dict[str, int]:
    return httpx.get(f"http://{ep}/stats", timeout=5).json()["paths"]


def _fake(ep: str, **body: Any) -> None:
    httpx.post(f"http://{ep}/fake-queue", json=body, timeout=5).raise_for_status()


def _audit_detail(stack: Any, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        with sqlite3.connect(stack.cfg.extproc.audit_db) as conn:
            row = conn.execute("SELECT detail FROM audit WHERE task_id = ? AND event = 'call'", (task_id,)).fetchone()
        if row is not None:
            return json.loads(row[0])
        assert time.monotonic() < deadline, f"no audit row for {task_id}"
        time.sleep(0.1)


def test_a_completion_passes_through_to_the_replica_the_picker_chose(stack: Any) -> None:
    before = [_paths(ep).get("/v1/completions", 0) for ep in stack.sim]
    raw = _client(stack).completions.with_raw_response.create(model="sim", prompt="hello there", max_tokens=5,
                                                              echo=True, logprobs=1)  # native fields: fine here
    done = raw.parse()
    assert done.object == "text_completion" and done.model == "sim"
    assert "echo: hello there" in done.choices[0].text and done.usage is not None
    replica = raw.headers["x-demo-replica"]
    assert sum(_paths(ep).get("/v1/completions", 0) for ep in stack.sim) == sum(before) + 1
    assert _paths(replica).get("/v1/chat/completions", 0) == 0  # never as a chat
    task = raw.headers["x-modelyard-task-id"]
    assert _audit_detail(stack, task)["replica"] == replica
    model, cluster, status, input_tokens, output_tokens, _ = metered_row(stack, task)
    assert (model, cluster, status) == ("sim", "demo-sim", 200) and input_tokens > 0 and output_tokens > 0


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_streamed_completion_passes_through_and_is_metered(stack: Any, include_usage: bool) -> None:
    raw = _client(stack).completions.with_raw_response.create(
        model="sim", prompt="stream me", max_tokens=5, stream=True,
        stream_options={"include_usage": True} if include_usage else None)
    chunks = list(raw.parse())
    assert all(c.object == "text_completion" for c in chunks)
    assert "echo: stream me" in "".join(c.choices[0].text for c in chunks if c.choices)
    usage = [c.usage for c in chunks if c.usage is not None]
    assert len(usage) == include_usage  # the usage chunk the gateway asked for itself never reaches the caller
    _, _, status, input_tokens, output_tokens, _ = metered_row(stack, raw.headers["x-modelyard-task-id"])
    assert status == 200 and input_tokens > 0 and output_tokens > 0


def _landed(client: openai.OpenAI, prompt: str) -> str:
    raw = client.completions.with_raw_response.create(model="sim", prompt=prompt, max_tokens=3)
    return raw.headers["x-demo-replica"]


def _settle(client: openai.OpenAI, expect: str) -> None:
    deadline = time.monotonic() + 10
    n = 0
    while _landed(client, f"settle {n}") != expect:  # the readings after _fake take a poll to arrive
        n += 1
        assert time.monotonic() < deadline, f"never landed on {expect}"


def test_prefix_affinity_holds_a_prompt_on_the_replica_that_has_its_start(stack: Any) -> None:
    a, b = stack.sim
    client = _client(stack)
    _fake(a, waiting=0)
    _fake(b, waiting=2)
    _settle(client, a)
    assert _landed(client, STORY + "Chapter one.") == a
    _fake(a, waiting=2)
    _fake(b, waiting=0)
    _settle(client, b)  # b has the shorter queue now: a new prompt goes there ...
    for chapter in ("two", "three", "four"):  # ... but the story's start is on a
        assert _landed(client, STORY + f"Chapter {chapter}.") == a, chapter
    assert _landed(client, "A different tale altogether. " * 30) == b
    _fake(a, waiting=0)
    _fake(b, waiting=0)


def test_a_chat_only_deployment_gets_the_prompt_as_a_chat_turn(stack: Any) -> None:
    client = _client(stack)
    before = _paths(stack.chatty)
    done = client.completions.create(model="chatty", prompt="translate me", max_tokens=7)
    assert done.object == "text_completion" and done.model == "chatty"
    assert "echo: translate me" in done.choices[0].text and done.choices[0].finish_reason == "stop"
    chunks = list(client.completions.create(model="chatty", prompt="and stream me", stream=True,
                                            stream_options={"include_usage": True}))
    assert "echo: and stream me" in "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    after = _paths(stack.chatty)
    assert after.get("/v1/chat/completions", 0) == before.get("/v1/chat/completions", 0) + 2
    assert after.get("/v1/completions", 0) == before.get("/v1/completions", 0)
    anthropic = client.completions.create(model="claude-ish", prompt="to Claude", max_tokens=9)
    assert "echo: to Claude" in anthropic.choices[0].text and anthropic.usage is not None
    streamed = client.completions.create(model="claude-ish", prompt="stream to Claude", stream=True)
    assert "echo: stream to Claude" in "".join(c.choices[0].text for c in streamed if c.choices)


@pytest.mark.parametrize(("fields", "named"), [
    ({"echo": True}, "echo"), ({"n": 2}, "n > 1"), ({"logprobs": 2}, "logprobs")])
def test_what_a_chat_turn_cannot_carry_is_a_400_in_openais_shape(stack: Any, fields: dict[str, Any],
                                                                  named: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _client(stack).completions.create(model="chatty", prompt="p", **fields)
    assert e.value.status_code == 400 and e.value.type == "invalid_request_error"
    assert named in e.value.message and "chatty" in e.value.message


def test_errors_and_limits_answer_in_openais_shape(stack: Any) -> None:
    with pytest.raises(openai.NotFoundError):
        _client(stack).completions.create(model="no-such-model", prompt="p")
    with pytest.raises(openai.BadRequestError, match="prompt"):
        _client(stack).completions.create(model="sim", prompt="")
    limited = _client(stack, LIMITED)
    for _ in range(2):  # the tenant's burst
        limited.completions.create(model="sim", prompt="within the limit", max_tokens=2)
    with pytest.raises(openai.RateLimitError):
        limited.completions.create(model="sim", prompt="past it", max_tokens=2)
