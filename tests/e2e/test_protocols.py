"""Both official SDKs reach every demo model through a real Envoy, whatever protocol its upstream
speaks: plain, streamed, and a tool-call round trip. A Gemini-shaped client reaches the OpenAI demo."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY

pytestmark = pytest.mark.e2e

# model -> the prefix its demo upstream puts on every answer (proves which upstream answered)
MODELS = {"demo-gpt": "[demo-openai]", "demo-claude": "[demo-anthropic]", "demo-gemini": "[demo-gemini]"}
WEATHER_TOOL_OPENAI = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WEATHER_TOOL_ANTHROPIC = {"name": "get_weather", "description": "Weather for a city",
                          "input_schema": WEATHER_TOOL_OPENAI["function"]["parameters"]}


@pytest.fixture(scope="module")
def oai(demo_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(demo_stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=demo_stack.url, api_key=DEMO_KEY, max_retries=0)


@pytest.mark.parametrize("model", MODELS)
def test_openai_sdk_plain(oai: openai.OpenAI, model: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": "be brief"},
                               {"role": "user", "content": f"plain hello to {model}"}])
    out = raw.parse()
    assert out.choices[0].message.content == f"{MODELS[model]} echo: plain hello to {model}"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0
    assert out.model == model
    assert raw.headers["x-modelyard-model"] == model


@pytest.mark.parametrize("model", MODELS)
def test_openai_sdk_stream(oai: openai.OpenAI, model: str) -> None:
    stream = oai.chat.completions.create(model=model, stream=True, stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "stream these words please"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"{MODELS[model]} echo: stream these words please"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]


def test_openai_stream_without_usage_gets_none(oai: openai.OpenAI) -> None:
    chunks = list(oai.chat.completions.create(model="demo-gpt", stream=True,
                                              messages=[{"role": "user", "content": "no usage"}]))
    assert all(c.choices for c in chunks)  # no usage-only chunk the client did not ask for


@pytest.mark.parametrize("model", MODELS)
def test_openai_sdk_tool_round_trip(oai: openai.OpenAI, model: str) -> None:
    messages = [{"role": "user", "content": "what is the weather in Paris"}]
    first = oai.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL_OPENAI])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"}]
    second = oai.chat.completions.create(model=model, messages=messages, tools=[WEATHER_TOOL_OPENAI])
    assert second.choices[0].message.content == f"{MODELS[model]} tool said: sunny, 21C"


@pytest.mark.parametrize("model", MODELS)
def test_openai_sdk_streamed_tool_call(oai: openai.OpenAI, model: str) -> None:
    chunks = list(oai.chat.completions.create(model=model, stream=True, tools=[WEATHER_TOOL_OPENAI],
                                              messages=[{"role": "user", "content": "weather in Oslo"}]))
    args = "".join(tc.function.arguments or "" for c in chunks if c.choices
                   for tc in (c.choices[0].delta.tool_calls or []))
    names = [tc.function.name for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])
             if tc.function and tc.function.name]
    assert names == ["get_weather"] and json.loads(args) == {"city": "Oslo"}


@pytest.mark.parametrize("model", MODELS)
def test_anthropic_sdk_plain(claude: anthropic.Anthropic, model: str) -> None:
    msg = claude.messages.create(model=model, max_tokens=200, system="be brief",
                                 messages=[{"role": "user", "content": f"hi {model}"}])
    assert msg.content[0].text == f"{MODELS[model]} echo: hi {model}"
    assert msg.stop_reason == "end_turn" and msg.role == "assistant"
    assert msg.usage.input_tokens > 0 and msg.usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_anthropic_sdk_stream(claude: anthropic.Anthropic, model: str) -> None:
    with claude.messages.stream(model=model, max_tokens=200,
                                messages=[{"role": "user", "content": "stream me some tokens"}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == f"{MODELS[model]} echo: stream me some tokens"
    assert len(pieces) > 1
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_anthropic_sdk_tool_round_trip(claude: anthropic.Anthropic, model: str) -> None:
    messages = [{"role": "user", "content": "what is the weather in Rome"}]
    first = claude.messages.create(model=model, max_tokens=200, tools=[WEATHER_TOOL_ANTHROPIC], messages=messages)
    assert first.stop_reason == "tool_use"
    use = next(b for b in first.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Rome"}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rainy"}]}]
    second = claude.messages.create(model=model, max_tokens=200, tools=[WEATHER_TOOL_ANTHROPIC], messages=messages)
    assert second.content[0].text == f"{MODELS[model]} tool said: rainy"


def test_gemini_client_reaches_openai_upstream(demo_stack) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "gemini asks openai"}]}]}
    r = httpx.post(f"{demo_stack.url}/v1beta/models/demo-gpt:generateContent", json=body,
                   headers={"x-goog-api-key": DEMO_KEY}, timeout=10)
    assert r.status_code == 200, r.text
    cand = r.json()["candidates"][0]
    assert cand["content"]["parts"][0]["text"] == "[demo-openai] echo: gemini asks openai"
    assert cand["finishReason"] == "STOP" and r.json()["usageMetadata"]["candidatesTokenCount"] > 0
    assert r.headers["x-modelyard-cluster"] == "demo-openai"


def test_gemini_stream_with_query_key(demo_stack) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "stream via gemini"}]}]}
    with httpx.stream("POST", f"{demo_stack.url}/v1beta/models/demo-claude:streamGenerateContent",
                      params={"alt": "sse", "key": DEMO_KEY}, json=body, timeout=10) as r:
        assert r.status_code == 200
        events = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    text = "".join(p.get("text", "") for e in events for c in e.get("candidates", [])
                   for p in c.get("content", {}).get("parts", []))
    assert text == "[demo-anthropic] echo: stream via gemini"


# -- bad input: errors in the caller's own shape ---------------------------------------------

@pytest.mark.parametrize("body", [
    b"{not json", b'{"model": "demo-claude", "messages": "nope"}', b'{"model": "demo-claude"}',
    b'{"model": "demo-claude", "messages": []}', b'{"model": "demo-claude", "messages": [{"role": "wizard", "content": "x"}]}',
    b'{"model": 5, "messages": [{"role": "user", "content": "x"}]}',
], ids=["not-json", "messages-string", "no-messages", "empty-messages", "unknown-role", "model-number"])
def test_openai_bad_input(demo_stack, body: bytes) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/chat/completions", content=body, timeout=10,
                   headers={"authorization": f"Bearer {DEMO_KEY}", "content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


@pytest.mark.parametrize("body", [
    b"[]", b'{"model": "demo-gpt", "max_tokens": 10, "messages": [{"role": "system", "content": "x"}]}',
    b'{"model": "demo-gpt", "max_tokens": "ten", "messages": [{"role": "user", "content": "x"}]}',
    b'{"model": "demo-gpt", "max_tokens": 10, "messages": []}',
], ids=["array", "system-role", "max_tokens-string", "empty-messages"])
def test_anthropic_bad_input(demo_stack, body: bytes) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/messages", content=body, timeout=10,
                   headers={"x-api-key": DEMO_KEY, "content-type": "application/json",
                            "anthropic-version": "2023-06-01"})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"


def test_anthropic_wrong_key_shape(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/messages", json={"model": "demo-gpt", "max_tokens": 5,
                                                          "messages": [{"role": "user", "content": "x"}]},
                   headers={"x-api-key": "sk-nope", "anthropic-version": "2023-06-01"}, timeout=10)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"


def test_gemini_bad_input_shape(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1beta/models/demo-gpt:generateContent", json={"contents": "x"},
                   headers={"x-goog-api-key": DEMO_KEY}, timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_gemini_stream_needs_sse(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1beta/models/demo-gpt:streamGenerateContent", timeout=10,
                   json={"contents": [{"role": "user", "parts": [{"text": "x"}]}]},
                   headers={"x-goog-api-key": DEMO_KEY})
    assert r.status_code == 400 and "alt=sse" in r.json()["error"]["message"]


# -- the upstream's fault: 502 in the caller's shape, streams that end instead of hanging ------

def test_upstream_error_becomes_502_openai_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="demo-claude", messages=[{"role": "user", "content": "demo-fail-500"}])
    assert e.value.status_code == 502
    assert "demo upstream failed on purpose" in e.value.response.json()["error"]["message"]


def test_upstream_error_becomes_502_anthropic_shape(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIStatusError) as e:
        claude.messages.create(model="demo-gpt", max_tokens=20, messages=[{"role": "user", "content": "demo-fail-500"}])
    assert e.value.status_code == 502
    body = e.value.response.json()
    assert body["type"] == "error" and "failed on purpose" in body["error"]["message"]


@pytest.mark.parametrize("model", ["demo-claude", "demo-gpt"])
def test_cut_stream_ends_with_an_error_not_a_hang(demo_stack, model: str) -> None:
    with httpx.stream("POST", f"{demo_stack.url}/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": model, "stream": True,
                            "messages": [{"role": "user", "content": "please demo-cut-stream now"}]}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines, "no events at all"
    last = lines[-1]
    assert "[DONE]" not in last or any('"error"' in ln for ln in lines)
    assert any('"error"' in ln for ln in lines), lines[-3:]


def test_cut_stream_anthropic_client_gets_error_event(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.APIError), claude.messages.stream(model="demo-gpt", max_tokens=50,
                                messages=[{"role": "user", "content": "x demo-cut-stream y"}]) as s:
        list(s.text_stream)


def test_cut_passthrough_stream_with_usage_gets_error_event(demo_stack) -> None:
    with httpx.stream("POST", f"{demo_stack.url}/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": "demo-gpt", "stream": True, "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": "please demo-cut-stream now"}]}) as r:
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert '"error"' in lines[-1] or '"error"' in lines[-2]


# -- credentials: the client's key stays at the gateway, the provider's key is injected -------

def test_upstreams_demand_provider_keys_the_gateway_injects(demo_stack) -> None:
    from tests.conftest import UPSTREAM_KEYS

    anthropic = demo_stack.cfg.clusters()["demo-anthropic"].endpoints[0]
    direct = httpx.post(f"http://{anthropic}/v1/messages", headers={"x-api-key": DEMO_KEY},
                        json={"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert direct.status_code == 401  # the client's own key is useless upstream...
    via = httpx.post(f"{demo_stack.url}/v1/messages", headers={"x-api-key": DEMO_KEY},
                     json={"model": "demo-claude", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    assert via.status_code == 200  # ...so this 200 means the gateway swapped in the provider's key
    text = " ".join(p.read_text(errors="replace") for p in demo_stack.log_dir.glob("*.log"))
    for secret in UPSTREAM_KEYS.values():
        assert secret not in text and secret not in via.text
    assert all(secret not in v for v in via.headers.values() for secret in UPSTREAM_KEYS.values())
