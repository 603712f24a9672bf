"""The OpenAI Responses API as a client protocol: the `openai` SDK's `client.responses.create`
(plain and streamed, with function tools and a function_call_output round trip) reaches every
demo upstream (OpenAI chat, Anthropic, Gemini) through a real Envoy, and is metered."""

from __future__ import annotations

import json
import re
import urllib.request

import openai
import pytest

from devstack.demo.faults import CUT, FAIL
from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row

pytestmark = pytest.mark.e2e

# model -> the prefix its demo upstream puts on every answer (proves which upstream answered)
MODELS = {"demo-gpt": "[demo-openai]", "demo-claude": "[demo-anthropic]", "demo-gemini": "[demo-gemini]"}
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def oai(demo_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def _tokens_metered(stack, model: str) -> float:
    """modelyard_tokens_total for the model (input and output), from the extproc's /metrics."""
    port = stack.cfg.extproc.metrics_address
    text = urllib.request.urlopen(f"http://{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("modelyard_tokens_total{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.parametrize("model", MODELS)
def test_responses_plain(oai: openai.OpenAI, demo_stack, model: str) -> None:
    before = _tokens_metered(demo_stack, model)
    raw = oai.responses.with_raw_response.create(model=model, instructions="be brief",
                                                 input=f"plain hello to {model}")
    resp = raw.parse()
    assert resp.output_text == f"{MODELS[model]} echo: plain hello to {model}"
    assert resp.status == "completed" and resp.object == "response" and resp.id.startswith("resp_")
    assert resp.output[0].type == "message" and resp.output[0].role == "assistant"
    assert resp.usage is not None and resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert raw.headers["x-modelyard-model"] == model
    assert resp.instructions == "be brief" and resp.tools == [] and resp.store is False
    # Metered like chat: the upstream's reported usage lands in the token counters.
    assert _tokens_metered(demo_stack, model) - before == resp.usage.total_tokens


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream_typed_events(oai: openai.OpenAI, model: str) -> None:
    events = list(oai.responses.create(model=model, stream=True,
                                       input=[{"role": "user", "content": "stream these words please"}]))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # really streamed, word by word
    assert "".join(deltas) == f"{MODELS[model]} echo: stream these words please"
    for kind in ("response.output_item.added", "response.content_part.added", "response.output_text.done",
                 "response.content_part.done", "response.output_item.done"):
        assert types.count(kind) == 1, kind
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    assert final.output_text == "".join(deltas) and final.usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_responses_stream_helper_accumulates(oai: openai.OpenAI, model: str) -> None:
    """The SDK's own stream state machine (`responses.stream`) accepts our event sequence."""
    with oai.responses.stream(model=model, input="helper stream check") as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(texts) == final.output_text == f"{MODELS[model]} echo: helper stream check"


@pytest.mark.parametrize("model", MODELS)
def test_responses_tool_round_trip(oai: openai.OpenAI, model: str) -> None:
    first = oai.responses.create(model=model, tools=[WEATHER_TOOL], input="what is the weather in Paris")
    calls = [o for o in first.output if o.type == "function_call"]
    assert [t.name for t in first.tools] == ["get_weather"]  # the whole answer echoes the request's tools
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments) == {"city": "Paris"}
    history: list = [{"role": "user", "content": "what is the weather in Paris"},
                     *[o.model_dump(exclude_none=True) for o in first.output],
                     {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"}]
    second = oai.responses.create(model=model, tools=[WEATHER_TOOL], input=history)
    assert second.output_text == f"{MODELS[model]} tool said: sunny, 21C"


@pytest.mark.parametrize("model", MODELS)
def test_responses_streamed_function_call(oai: openai.OpenAI, model: str) -> None:
    events = list(oai.responses.create(model=model, stream=True, tools=[WEATHER_TOOL], input="weather in Oslo"))
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    assert [a.name for a in added] == ["get_weather"]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Oslo"}
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == args and done.item_id == added[0].id
    final = events[-1]
    assert final.type == "response.completed"
    assert [o.call_id for o in final.response.output if o.type == "function_call"] == [added[0].call_id]


def test_previous_response_id_is_a_clear_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="demo-gpt", input="again", previous_response_id="resp_123")
    assert e.value.status_code == 400
    body = e.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    assert re.search(r"previous_response_id is not supported", body["message"])


def test_unknown_model_in_openai_error_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        oai.responses.create(model="no-such-model", input="hi")
    assert isinstance(e.value.body, dict) and e.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("model", MODELS)
def test_streamed_response_is_metered_from_its_usage(oai: openai.OpenAI, demo_stack, model: str) -> None:
    raw = oai.responses.with_raw_response.create(model=model, stream=True, input="meter this stream")
    events = list(raw.parse())
    usage = events[-1].response.usage
    row = metered_row(demo_stack, raw.headers["x-modelyard-task-id"])
    assert row[:5] == (model, raw.headers["x-modelyard-cluster"], 200, usage.input_tokens, usage.output_tokens)
    assert usage.input_tokens > 0 and usage.output_tokens > 0


@pytest.mark.parametrize("model", MODELS)
def test_upstream_failure_is_a_502_in_openai_shape(oai: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        oai.responses.create(model=model, input=f"please {FAIL}")
    assert e.value.status_code == 502
    assert isinstance(e.value.body, dict) and e.value.body["type"] == "server_error"


@pytest.mark.parametrize("model", MODELS)
def test_cut_stream_ends_with_response_failed(oai: openai.OpenAI, model: str) -> None:
    events = list(oai.responses.create(model=model, stream=True, input=f"words then {CUT} and more words"))
    assert events[0].type == "response.created"
    assert events[-1].type == "response.failed" and events[-1].response.status == "failed"
    assert events[-1].response.error is not None and events[-1].response.error.message
    # What did stream is closed properly before the failure is told.
    added = [e.item.id for e in events if e.type == "response.output_item.added"]
    done = [e.item.id for e in events if e.type == "response.output_item.done"]
    assert added and added == done


def test_stored_state_endpoints_say_nothing_is_stored(oai: openai.OpenAI) -> None:
    for call in (lambda: oai.responses.retrieve("resp_123"), lambda: oai.responses.delete("resp_123"),
                 lambda: oai.responses.input_items.list("resp_123")):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        assert isinstance(e.value.body, dict) and "does not store responses" in e.value.body["message"]


@pytest.mark.parametrize("model", MODELS)
def test_stream_helper_accumulates_function_calls(oai: openai.OpenAI, model: str) -> None:
    """The SDK's stream state machine builds the same function call from our events as the whole answer has."""
    with oai.responses.stream(model=model, tools=[WEATHER_TOOL], input="weather in Lima") as stream:
        arg_deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    call = next(o for o in final.output if o.type == "function_call")
    assert call.name == "get_weather" and call.arguments == "".join(arg_deltas)
    assert json.loads(call.arguments) == {"city": "Lima"} and final.status == "completed"


def test_rate_limited_in_openai_shape(demo_stack) -> None:
    """demo-limited's bucket holds 3 requests and refills 1/s: a burst of 6 meets a 429."""
    limited = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key="sk-modelyard-demo-limited", max_retries=0)
    refused = []
    for _ in range(6):
        try:
            limited.responses.create(model="demo-gpt", input="burst")
        except openai.RateLimitError as e:
            refused.append(e)
    assert refused and refused[0].response.headers.get("retry-after")
    assert isinstance(refused[0].body, dict) and refused[0].body["code"] == "rate_limit_exceeded"



SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}


@pytest.mark.parametrize("model", MODELS)
def test_structured_output_reaches_every_upstream(oai: openai.OpenAI, model: str) -> None:
    """text.format (Responses' flat json_schema) is rendered in each upstream's own terms, which its
    parser (the demo's is the adapter's) accepts; the answer echoes it."""
    resp = oai.responses.create(model=model, input="structured please",
                                text={"format": {"type": "json_schema", "name": "reply", "strict": True,
                                                 "schema": SCHEMA}})
    assert resp.output_text == f"{MODELS[model]} echo: structured please"
    assert resp.text.format.type == "json_schema" and resp.text.format.name == "reply"


@pytest.mark.parametrize("model", MODELS)
def test_parallel_tool_calls_off_where_the_upstream_can_say_it(oai: openai.OpenAI, model: str) -> None:
    if model == "demo-gemini":  # Gemini has no such control: a clear 400, never silence
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(model=model, input="one call at most", tools=[WEATHER_TOOL],
                                 parallel_tool_calls=False)
        assert "parallel_tool_calls" in e.value.body["message"]
        return
    resp = oai.responses.create(model=model, input="one call at most", tools=[WEATHER_TOOL],
                                parallel_tool_calls=False)
    assert resp.output_text == f"{MODELS[model]} echo: one call at most" and resp.parallel_tool_calls is False
