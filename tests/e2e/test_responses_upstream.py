"""A Responses API upstream (`protocol: responses`, demo-gpt-responses) through a real Envoy: the
openai SDK's chat completions (plain, streamed, tools) and the anthropic SDK's messages (plain,
streamed) are translated to POST /v1/responses; `responses.create` (plain, streamed) passes
through. The demo upstream demands the provider key, so every 200 proves the gateway injected it.
An answer holding what the caller's protocol cannot express (a hosted tool's call, a custom tool
call) is a clear error in the caller's shape, whole or streamed; a Responses caller gets that same
answer as sent. A reasoning summary before function calls reaches a chat caller as
`reasoning_content` and an Anthropic caller as a thinking block signed with the encrypted content."""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devstack.demo.responses_server import CUSTOM_TOOL, REASONING, REASONING_SUMMARY, WEB_SEARCH
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.e2e.metered import metered_row
from tests.stack_config import demo_config_free_ports, free_port, start_stack

pytestmark = pytest.mark.e2e

MODEL = "demo-gpt-responses"
PREFIX = "[demo-responses]"
HIDDEN = "demo-gpt-responses-hidden-reasoning"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
                "parameters": WEATHER["function"]["parameters"]}  # type: ignore[index]
CLAUDE_TOOL = {"name": "get_weather", "description": "Weather for a city",
               "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]


PINNED = {"x-modelyard-strategy": "pinned"}


def _mixed(name: str, dead: str, live: str) -> dict[str, Any]:
    """A model whose first deployment (`dead` protocol) has nobody listening and whose peer (`live`)
    is a demo: a pinned request starts at the dead one and Envoy fails over through a translation hop."""
    return {"name": name, "capabilities": {"tools": True}, "deployments": [
        {"cluster": f"dead-{dead}", "protocol": dead, "endpoints": [f"127.0.0.1:{free_port()}"]},
        {"cluster": f"demo-{name}", "protocol": live, "endpoints": [f"127.0.0.1:{free_port()}"]}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"] if m["name"] == MODEL]
    # The same demo upstream behind a deployment whose reasoning policy is `drop` (OpenAI chat's own).
    hidden = copy.deepcopy(data["models"][0])
    hidden["name"] = HIDDEN
    for d in hidden["deployments"]:
        d["cluster"], d["reasoning"], d["endpoints"] = d["cluster"] + "-hidden", "drop", [f"127.0.0.1:{free_port()}"]
    data["models"].append(hidden)
    data["models"] += [_mixed("to-responses", "openai", "responses"), _mixed("from-responses", "responses", "openai")]
    # A quality-only strategy ties each pair; config order puts the dead one first.
    data["routing"] = {"strategies": {"pinned": {"quality": 1}}}
    os.environ.setdefault("DEMO_OPENAI_KEY", UPSTREAM_KEYS["DEMO_OPENAI_KEY"])
    with start_stack(tmp_path_factory.mktemp("responses-upstream"), data, shared_demos=True) as s:
        yield s


@pytest.fixture(scope="module")
def oai(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(stack: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)


# ---- chat clients, translated ------------------------------------------------------------------


def test_chat_completions_plain(oai: openai.OpenAI, stack: Any) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}])
    out = raw.parse()
    assert out.choices[0].message.content == f"{PREFIX} echo: hello there"
    assert out.choices[0].finish_reason == "stop" and out.model == MODEL
    assert raw.headers["x-modelyard-cluster"] == "demo-responses"
    assert out.usage is not None and out.usage.prompt_tokens == 4 and out.usage.completion_tokens == 4
    row = metered_row(stack, raw.headers["x-modelyard-task-id"])
    assert row[:5] == (MODEL, "demo-responses", 200, 4, 4)


def test_chat_completions_stream(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(model=MODEL, stream=True, stream_options={"include_usage": True},
                                              messages=[{"role": "user", "content": "stream these words"}]))
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 1 and "".join(deltas) == f"{PREFIX} echo: stream these words"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


def test_chat_completions_tool_round_trip(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(model=MODEL, tools=[WEATHER],  # type: ignore[list-item]
                                        messages=[{"role": "user", "content": "weather in Paris"}])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    second = oai.chat.completions.create(model=MODEL, tools=[WEATHER], messages=[  # type: ignore[list-item]
        {"role": "user", "content": "weather in Paris"}, first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}])
    assert second.choices[0].message.content == f"{PREFIX} tool said: sunny, 21C"


def test_chat_completions_streamed_tool_call(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(model=MODEL, stream=True, tools=[WEATHER],  # type: ignore[list-item]
                                              messages=[{"role": "user", "content": "weather in Oslo"}]))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert calls[0].function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"city": "Oslo"}  # type: ignore[union-attr]


def test_anthropic_messages_plain_and_stream(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=MODEL, max_tokens=100, system="be brief",
                                 messages=[{"role": "user", "content": "hello claude client"}])
    assert msg.content[0].text == f"{PREFIX} echo: hello claude client"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 5
    with claude.messages.stream(model=MODEL, max_tokens=100,
                                messages=[{"role": "user", "content": "stream to claude"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == f"{PREFIX} echo: stream to claude" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 5


def test_anthropic_messages_tool_use(claude: anthropic.Anthropic) -> None:
    msg = claude.messages.create(model=MODEL, max_tokens=100, tools=[CLAUDE_TOOL],  # type: ignore[list-item]
                                 messages=[{"role": "user", "content": "weather in Rome"}])
    use = next(b for b in msg.content if b.type == "tool_use")
    assert msg.stop_reason == "tool_use" and use.name == "get_weather" and use.input == {"city": "Rome"}


def test_hidden_reasoning_is_no_obstacle(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"think {REASONING}"}])
    assert out.choices[0].message.content == f"{PREFIX} echo: think {REASONING}"


def test_gemini_client_plain_stream_and_untranslatable(stack: Any) -> None:
    """No Gemini SDK here: its REST shape over httpx, key in Gemini's own header."""
    head = {"x-goog-api-key": DEMO_KEY}
    body = {"contents": [{"role": "user", "parts": [{"text": "gemini asks responses"}]}]}
    r = httpx.post(f"{stack.url}/v1beta/models/{MODEL}:generateContent", json=body, headers=head, timeout=10)
    assert r.status_code == 200, r.text
    cand = r.json()["candidates"][0]
    assert cand["content"]["parts"][0]["text"] == f"{PREFIX} echo: gemini asks responses"
    assert cand["finishReason"] == "STOP" and r.json()["usageMetadata"]["candidatesTokenCount"] == 5
    with httpx.stream("POST", f"{stack.url}/v1beta/models/{MODEL}:streamGenerateContent", params={"alt": "sse"},
                      json=body, headers=head, timeout=10) as r:
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert "".join(p.get("text", "") for e in events for c in e.get("candidates", [])
                   for p in c["content"]["parts"]) == f"{PREFIX} echo: gemini asks responses"
    r = httpx.post(f"{stack.url}/v1beta/models/{MODEL}:generateContent", headers=head, timeout=10,
                   json={"contents": [{"role": "user", "parts": [{"text": f"go {WEB_SEARCH}"}]}]})
    assert r.status_code == 502 and "web_search_call" in r.json()["error"]["message"]


# ---- Responses clients, passed through ---------------------------------------------------------


def test_responses_create_plain_passes_through(oai: openai.OpenAI, stack: Any) -> None:
    raw = oai.responses.with_raw_response.create(model=MODEL, instructions="be brief", input="plain responses")
    resp = raw.parse()
    assert resp.output_text == f"{PREFIX} echo: plain responses" and resp.status == "completed"
    assert resp.usage is not None and resp.instructions == "be brief"
    row = metered_row(stack, raw.headers["x-modelyard-task-id"])
    assert row[:5] == (MODEL, "demo-responses", 200, resp.usage.input_tokens, resp.usage.output_tokens)


def test_responses_create_stream_passes_through(oai: openai.OpenAI, stack: Any) -> None:
    raw = oai.responses.with_raw_response.create(model=MODEL, stream=True, tools=[WEATHER_TOOL],  # type: ignore[list-item]
                                                 input="weather in Lima")
    events = list(raw.parse())
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Lima"}
    usage = events[-1].response.usage
    assert usage is not None
    row = metered_row(stack, raw.headers["x-modelyard-task-id"])
    assert row[:5] == (MODEL, "demo-responses", 200, usage.input_tokens, usage.output_tokens)


def test_a_responses_caller_gets_hosted_tool_output_as_sent(stack: Any, oai: openai.OpenAI) -> None:
    # A hosted tool in the request, and its call in the answer: both pass through untouched, the
    # search billed apart from the tokens (demo-gpt-responses: $2.50 / $10 per 1M, $0.01 a search).
    raw = oai.responses.with_raw_response.create(model=MODEL, input=f"look it up {WEB_SEARCH}",
                                                 tools=[{"type": "web_search"}])
    resp = raw.parse()
    assert [o.type for o in resp.output] == ["web_search_call", "message"]
    assert resp.usage is not None
    tokens = (resp.usage.input_tokens * 2.5 + resp.usage.output_tokens * 10.0) / 1000
    assert metered_row(stack, raw.headers["x-modelyard-task-id"])[5] == pytest.approx(tokens + 0.01)
    streamed = oai.responses.with_streaming_response.create(model=MODEL, stream=True, input=f"look it up {WEB_SEARCH}")
    with streamed as r:
        events = list(r.parse())
        task = r.headers["x-modelyard-task-id"]
    assert events[-1].type == "response.completed"
    assert [o.type for o in events[-1].response.output] == ["web_search_call", "message"]
    usage = events[-1].response.usage
    assert usage is not None
    tokens = (usage.input_tokens * 2.5 + usage.output_tokens * 10.0) / 1000
    assert metered_row(stack, task)[5] == pytest.approx(tokens + 0.01)


# ---- what a chat caller's protocol cannot express: a clear error -------------------------------


@pytest.mark.parametrize("marker", [WEB_SEARCH, CUSTOM_TOOL])
def test_untranslatable_answer_is_a_502_in_openai_shape(oai: openai.OpenAI, marker: str) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"go {marker}"}])
    assert e.value.status_code == 502
    body = e.value.body
    assert isinstance(body, dict) and "cannot express" in body["message"] and "/v1/responses" in body["message"]


def test_untranslatable_answer_is_a_502_in_anthropic_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": f"go {WEB_SEARCH}"}])
    assert e.value.status_code == 502
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "error" and "web_search_call" in body["error"]["message"]


def test_untranslatable_stream_ends_in_an_error_for_each_sdk(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.APIError) as e:
        list(oai.chat.completions.create(model=MODEL, stream=True,
                                         messages=[{"role": "user", "content": f"go {CUSTOM_TOOL}"}]))
    assert "custom_tool_call" in e.value.message
    with pytest.raises(anthropic.APIStatusError) as e2, claude.messages.stream(model=MODEL, max_tokens=50,
                                messages=[{"role": "user", "content": f"go {WEB_SEARCH}"}]) as s:
        list(s.text_stream)
    assert "web_search_call" in str(e2.value)


# ---- a reasoning model's summary before its function calls (issue 37) ----------------------------

SUMMARY = "The user wants an echo."


def test_a_reasoning_stream_with_tool_calls_reaches_the_openai_sdk_whole(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(model=MODEL, tools=[WEATHER],  # type: ignore[list-item]
                                     messages=[{"role": "user", "content": f"{REASONING_SUMMARY}: weather in Paris"}]) as s:
        chunks = [e.chunk for e in s if e.type == "chunk"]
        final = s.get_final_completion()
    thought = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert thought == SUMMARY
    call = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_a_reasoning_stream_with_tool_calls_reaches_the_anthropic_sdk_whole(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=100, tools=[CLAUDE_TOOL],  # type: ignore[list-item]
                                messages=[{"role": "user", "content": f"{REASONING_SUMMARY}: weather in Paris"}]) as s:
        kinds = [e.type for e in s]
        msg = s.get_final_message()
    assert "thinking" in kinds and "signature" in kinds
    assert [b.type for b in msg.content] == ["thinking", "tool_use"]
    assert msg.content[0].thinking == SUMMARY and msg.content[0].signature == "gAAAAA-demo-state"  # type: ignore[union-attr]
    assert msg.content[1].input == {"city": "Paris"} and msg.stop_reason == "tool_use"  # type: ignore[union-attr]


def test_a_plain_reasoning_answer_reaches_each_sdk_with_its_reasoning(oai: openai.OpenAI,
                                                                      claude: anthropic.Anthropic) -> None:
    out = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"go {REASONING_SUMMARY}"}])
    assert getattr(out.choices[0].message, "reasoning_content", None) == SUMMARY
    assert out.choices[0].message.content == f"{PREFIX} echo: go {REASONING_SUMMARY}"
    msg = claude.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": f"go {REASONING_SUMMARY}"}])
    assert [b.type for b in msg.content] == ["thinking", "text"] and msg.content[0].thinking == SUMMARY  # type: ignore[union-attr]


def test_a_deployment_that_drops_reasoning_answers_without_it(oai: openai.OpenAI,
                                                              claude: anthropic.Anthropic) -> None:
    chunks = list(oai.chat.completions.create(model=HIDDEN, stream=True, tools=[WEATHER],  # type: ignore[list-item]
                                              messages=[{"role": "user", "content": f"{REASONING_SUMMARY}: weather in Oslo"}]))
    assert not any(getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    msg = claude.messages.create(model=HIDDEN, max_tokens=50, messages=[{"role": "user", "content": f"go {REASONING_SUMMARY}"}])
    assert [b.type for b in msg.content] == ["text"]


def test_stop_sequences_are_a_clear_400(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=MODEL, stop=["END"], messages=[{"role": "user", "content": "hi"}])
    assert "stop sequences" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as e2:
        claude.messages.create(model=MODEL, max_tokens=9, stop_sequences=["END"],
                               messages=[{"role": "user", "content": "hi"}])
    assert "stop sequences" in str(e2.value)


# ---- failover across protocols: translation hops to and from a Responses deployment ------------


def test_a_chat_caller_fails_over_to_a_responses_peer(claude: anthropic.Anthropic, stack: Any) -> None:
    """Anthropic caller -> dead OpenAI deployment -> hop xlate~openai~demo-to-responses (Responses); the
    stream after it may go straight to the peer, once the scheduler has learnt the dead one failed."""
    client = claude.with_options(default_headers=PINNED)
    msg = client.messages.create(model="to-responses", max_tokens=50, messages=[{"role": "user", "content": "hop"}])
    assert msg.content[0].text == "[demo-to-responses] echo: hop"  # type: ignore[union-attr]
    with client.messages.stream(model="to-responses", max_tokens=50,
                                messages=[{"role": "user", "content": "hop streamed"}]) as s:
        assert "".join(s.text_stream) == "[demo-to-responses] echo: hop streamed"


def test_a_responses_caller_fails_over_from_a_responses_deployment(oai: openai.OpenAI, stack: Any) -> None:
    """Responses caller -> dead Responses deployment -> hop xlate~responses~demo-from-responses (OpenAI chat)."""
    client = oai.with_options(default_headers=PINNED)
    resp = client.responses.create(model="from-responses", input="hop back")
    assert resp.output_text == "[demo-from-responses] echo: hop back" and resp.status == "completed"
    stats = httpx.get(f"{stack.admin_url()}/stats?filter=upstream_rq_total").text
    counts = {ln.split(":")[0]: int(ln.split(":")[1]) for ln in stats.splitlines() if ":" in ln}
    assert counts["cluster.xlate~openai~demo-to-responses.upstream_rq_total"] >= 1
    assert counts["cluster.xlate~responses~demo-from-responses.upstream_rq_total"] >= 1
