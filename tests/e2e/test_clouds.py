"""The cloud upstreams through a real Envoy: both official SDKs reach Azure OpenAI, Bedrock and
Vertex AI demo upstreams, plain and streamed, with a tool call; each demo checks the credential
the way its cloud does (api-key + api-version, a SigV4 signature, an OAuth2 bearer token), so every
200 proves the gateway authenticated, and the client's own key never reached the cloud."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

AZURE_KEY = UPSTREAM_KEYS["DEMO_AZURE_KEY"]
CLOUD_MODELS = ("demo-azure", "demo-bedrock", "demo-vertex", "demo-vertex-claude")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def cloud_config(workdir: Path) -> dict[str, Any]:
    """The shipped config's cloud models only, on free ports, credentials files under `workdir`."""
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"] if m["name"] in CLOUD_MODELS]
    for m in data["models"]:
        for d in m["deployments"]:
            for section in ("bedrock", "vertex"):  # each demo writes its credentials file there
                if section in d:
                    d[section] = {**d[section], "credentials_file": str(workdir / f"{d['cluster']}-credentials")}
    # The Bedrock demo's endpoint signed for another region: AWS (and the demo) refuse it with a 403.
    bedrock = next(m for m in data["models"] if m["name"] == "demo-bedrock")
    wrong = {**bedrock["deployments"][0], "cluster": "bedrock-wrong-region"}
    wrong["bedrock"] = {**wrong["bedrock"], "region": "eu-west-3"}
    data["models"].append({**bedrock, "name": "bedrock-wrong-region", "deployments": [wrong]})
    return data


@pytest.fixture(scope="module")
def cloud_stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("clouds")
    os.environ["DEMO_AZURE_KEY"] = AZURE_KEY
    with start_stack(workdir, cloud_config(workdir), shared_demos=True) as stack:
        yield stack


@pytest.fixture(scope="module")
def oai(cloud_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cloud_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


@pytest.fixture(scope="module")
def claude(cloud_stack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cloud_stack.url, api_key=DEMO_KEY, max_retries=0)


@pytest.mark.parametrize("model", CLOUD_MODELS)
def test_openai_sdk_plain(oai: openai.OpenAI, model: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello cloud"}])
    out = raw.parse()
    assert out.choices[0].message.content == f"[{model}] echo: hello cloud"
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.prompt_tokens > 0 and out.usage.completion_tokens > 0
    assert out.model == model and raw.headers["x-modelyard-model"] == model


@pytest.mark.parametrize("model", CLOUD_MODELS)
def test_openai_sdk_stream(oai: openai.OpenAI, model: str) -> None:
    chunks = list(oai.chat.completions.create(model=model, stream=True, stream_options={"include_usage": True},
                                              messages=[{"role": "user", "content": "stream these words please"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == f"[{model}] echo: stream these words please"
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1
    assert chunks[0].id and all(c.id == chunks[0].id for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


@pytest.mark.parametrize("model", CLOUD_MODELS)
def test_openai_sdk_tool_round_trip(oai: openai.OpenAI, model: str) -> None:
    msgs: list[Any] = [{"role": "user", "content": "what is the weather in Paris"}]
    first = oai.chat.completions.create(model=model, messages=msgs, tools=[WEATHER])
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    msgs += [first.choices[0].message.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    second = oai.chat.completions.create(model=model, messages=msgs, tools=[WEATHER])
    assert second.choices[0].message.content == f"[{model}] tool said: sunny"


@pytest.mark.parametrize("model", CLOUD_MODELS)
def test_anthropic_sdk_plain_and_stream(claude: anthropic.Anthropic, model: str) -> None:
    msg = claude.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "hi there"}])
    assert msg.content[0].text == f"[{model}] echo: hi there" and msg.stop_reason == "end_turn"
    assert msg.usage.output_tokens > 0
    with claude.messages.stream(model=model, max_tokens=64,
                                messages=[{"role": "user", "content": "stream to claude"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == f"[{model}] echo: stream to claude"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0


def test_anthropic_sdk_tool_stream_from_bedrock(claude: anthropic.Anthropic) -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}  # type: ignore[index]
    with claude.messages.stream(model="demo-bedrock", max_tokens=64, tools=[tool],  # type: ignore[list-item]
                                messages=[{"role": "user", "content": "weather in Oslo"}]) as s:
        final = s.get_final_message()
    use = next(b for b in final.content if b.type == "tool_use")
    assert use.name == "get_weather" and use.input == {"city": "Oslo"} and final.stop_reason == "tool_use"


def test_refused_features_are_a_clear_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="demo-bedrock", messages=[{"role": "user", "content": "x"}],
                                    response_format={"type": "json_object"})
    assert "Bedrock" in str(e.value)


def test_clients_key_never_reaches_the_cloud(cloud_stack) -> None:
    """The caller's own `api-key` header (Azure's) is stripped: the demo demands the upstream key."""
    r = httpx.post(f"{cloud_stack.url}/v1/chat/completions",
                   headers={"authorization": f"Bearer {DEMO_KEY}", "api-key": "client-supplied"},
                   json={"model": "demo-azure", "messages": [{"role": "user", "content": "who am i"}]}, timeout=10)
    assert r.status_code == 200 and "client-supplied" not in r.text


def test_a_cloud_refusing_our_credentials_is_a_502_in_the_callers_shape(oai: openai.OpenAI,
                                                                          claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="bedrock-wrong-region", messages=[{"role": "user", "content": "x"}])
    assert e.value.status_code == 502 and "HTTP 403" in str(e.value)
    with pytest.raises(anthropic.InternalServerError) as e2:
        claude.messages.create(model="bedrock-wrong-region", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert e2.value.status_code == 502 and e2.value.body["type"] == "error"  # type: ignore[index]


def test_no_credential_reaches_a_log(cloud_stack) -> None:
    """After every test above: no key, secret, private key or issued token in any log of the stack."""
    workdir = Path(cloud_stack.workdir)
    secrets = [AZURE_KEY]
    for f in workdir.glob("*-credentials"):
        text = f.read_text()
        if f.name.startswith("demo-bedrock"):
            secrets += [ln.split("=", 1)[1].strip() for ln in text.splitlines() if "aws_secret_access_key" in ln]
        else:
            secrets.append(json.loads(text)["private_key"].splitlines()[1])
    logs = "".join(p.read_text(errors="replace") for p in workdir.glob("*.log"))
    assert len(secrets) >= 4 and logs
    assert not [s for s in secrets if s in logs]
    assert "ya29.demo-" not in logs  # the Vertex access tokens
