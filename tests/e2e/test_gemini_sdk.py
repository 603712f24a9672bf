"""Google's own SDK (google-genai) through a real Envoy, on both API versions it speaks (v1, its default,
and v1beta): generation and streams from every protocol's demo upstream, countTokens, the model list,
embeddings, and errors in Gemini's shape."""

from __future__ import annotations

import httpx
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types as gt

from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row

pytestmark = pytest.mark.e2e

# model -> the prefix its demo upstream puts on every answer (proves which upstream answered)
MODELS = {"demo-gemini": "[demo-gemini]", "demo-gpt": "[demo-openai]", "demo-claude": "[demo-anthropic]"}
VERSIONS = ("v1", "v1beta")


def client(stack, version: str, key: str = DEMO_KEY) -> genai.Client:
    return genai.Client(api_key=key, http_options=gt.HttpOptions(base_url=stack.url, api_version=version,
                                                                 timeout=30_000))


@pytest.fixture(scope="module")
def clients(demo_stack) -> dict[str, genai.Client]:
    # held for the module: a Client closes its connections when it is collected, under its `.models`
    return {version: client(demo_stack, version) for version in VERSIONS}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("model", MODELS)
def test_generate_content_from_every_protocols_upstream(clients, model: str, version: str) -> None:
    out = clients[version].models.generate_content(
        model=model, contents=f"hello {model} on {version}",
        config=gt.GenerateContentConfig(system_instruction="be brief", max_output_tokens=64))
    assert out.text == f"{MODELS[model]} echo: hello {model} on {version}"
    assert out.candidates[0].finish_reason == gt.FinishReason.STOP
    usage = out.usage_metadata
    assert usage.prompt_token_count > 0 and usage.candidates_token_count > 0
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count


@pytest.mark.parametrize("model", MODELS)
def test_stream_from_every_protocols_upstream(clients, model: str) -> None:
    chunks = list(clients["v1"].models.generate_content_stream(
        model=model, contents="stream these words please"))
    assert len([c for c in chunks if c.text]) > 1  # really streamed
    assert "".join(c.text or "" for c in chunks) == f"{MODELS[model]} echo: stream these words please"
    assert chunks[-1].usage_metadata.candidates_token_count > 0


@pytest.mark.parametrize("version", VERSIONS)
def test_count_tokens_is_the_gateways_estimate_in_geminis_shape(clients, version: str) -> None:
    models = clients[version].models
    short = models.count_tokens(model="demo-gemini", contents="count me").total_tokens
    long = models.count_tokens(model="demo-gemini", contents="count me " * 50).total_tokens
    assert 0 < short < long
    # the same estimate whatever protocol the model's upstream speaks: nothing is sent upstream
    assert models.count_tokens(model="demo-gpt", contents="count me").total_tokens == short
    with pytest.raises(genai_errors.ClientError) as e:
        models.count_tokens(model="no-such-model", contents="x")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_model_list_and_a_model_in_geminis_shape(clients, version: str) -> None:
    models = clients[version].models
    listed = {m.name: m for m in models.list()}
    assert "generateContent" in listed["models/demo-gemini"].supported_actions
    assert "embedContent" in listed["models/demo-embed-gemini"].supported_actions
    got = models.get(model="demo-gemini")
    assert got.name == "models/demo-gemini" and got.input_token_limit
    with pytest.raises(genai_errors.ClientError) as e:
        models.get(model="no-such-model")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"


def test_embeddings_one_per_input_from_either_upstream(clients) -> None:
    models = clients["v1"].models
    # a name without "gemini": the SDK sends one request per input (batchEmbedContents), here to an OpenAI upstream
    two = models.embed_content(model="demo-embed", contents=["one", "two"]).embeddings
    assert len(two) == 2 and two[0].values and two[0].values != two[1].values
    # a "gemini" name: the SDK sends the inputs as one multimodal content, so one embedding comes back
    one = models.embed_content(model="demo-embed-gemini", contents=["one", "two"]).embeddings
    assert len(one) == 1 and one[0].values


def test_errors_in_geminis_shape(demo_stack, clients) -> None:
    stranger = client(demo_stack, "v1", key="sk-not-a-key")
    with pytest.raises(genai_errors.ClientError) as e:
        stranger.models.generate_content(model="demo-gemini", contents="x")
    assert e.value.code == 401 and e.value.status == "UNAUTHENTICATED"
    with pytest.raises(genai_errors.ClientError) as e:
        clients["v1"].models.generate_content(model="no-such-model", contents="x")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND"
    # an action the gateway does not serve: a 404 a Gemini client can read, not another protocol's shape
    r = httpx.post(f"{demo_stack.url}/v1beta/models/demo-gemini:fooBar", json={},
                   headers={"x-goog-api-key": DEMO_KEY})
    assert r.status_code == 404
    assert r.json()["error"]["status"] == "NOT_FOUND" and "fooBar" in r.json()["error"]["message"]


def test_candidates_and_geminis_own_tools_pass_through_to_a_gemini_upstream_only(clients) -> None:
    models = clients["v1beta"].models
    one = models.generate_content(model="demo-gemini", contents="two takes")
    two = models.generate_content(model="demo-gemini", contents="two takes",
                                  config=gt.GenerateContentConfig(candidate_count=2))
    assert [c.content.parts[0].text for c in two.candidates] == [one.text, one.text]
    assert two.usage_metadata.candidates_token_count == 2 * one.usage_metadata.candidates_token_count
    streamed = list(models.generate_content_stream(model="demo-gemini", contents="two takes",
                                                   config=gt.GenerateContentConfig(candidate_count=2)))
    assert {len(c.candidates) for c in streamed if c.candidates} == {2}
    search = gt.GenerateContentConfig(tools=[gt.Tool(google_search=gt.GoogleSearch())])
    assert models.generate_content(model="demo-gemini", contents="search this", config=search).text == \
        "[demo-gemini] echo: search this"
    for model in ("demo-gpt", "demo-claude"):  # translated: nothing there runs Google Search or answers twice
        with pytest.raises(genai_errors.ClientError) as e:
            models.generate_content(model=model, contents="search this", config=search)
        assert e.value.code == 400 and "tools[0].googleSearch" in str(e.value)
        with pytest.raises(genai_errors.ClientError, match="candidateCount > 1"):
            models.generate_content(model=model, contents="x", config=gt.GenerateContentConfig(candidate_count=2))


def test_google_search_grounding_is_billed_per_query_as_gemini_reports_it(demo_stack, clients) -> None:
    # demo-gemini: $1.25 / $5 per 1M tokens and $0.014 a search query (Gemini 3's grounding price)
    search = gt.GenerateContentConfig(tools=[gt.Tool(google_search=gt.GoogleSearch())])
    out = clients["v1beta"].models.generate_content(model="demo-gemini", contents="who won", config=search)
    meta = out.candidates[0].grounding_metadata
    assert meta is not None and meta.web_search_queries == ["who won"]
    u = out.usage_metadata
    tokens = (u.prompt_token_count * 1.25 + u.candidates_token_count * 5.0) / 1000
    row = metered_row(demo_stack, out.sdk_http_response.headers["x-modelyard-task-id"])
    assert row[0] == "demo-gemini" and row[5] == pytest.approx(tokens + 0.014)
    chunks = list(clients["v1beta"].models.generate_content_stream(model="demo-gemini", contents="who won",
                                                                   config=search))
    assert [c.candidates[0].grounding_metadata.web_search_queries for c in chunks
            if c.candidates and c.candidates[0].grounding_metadata] == [["who won"]]
    u = chunks[-1].usage_metadata
    tokens = (u.prompt_token_count * 1.25 + u.candidates_token_count * 5.0) / 1000
    row = metered_row(demo_stack, chunks[-1].sdk_http_response.headers["x-modelyard-task-id"])
    assert row[5] == pytest.approx(tokens + 0.014)
    plain = clients["v1beta"].models.generate_content(model="demo-gemini", contents="who won")
    u = plain.usage_metadata
    assert metered_row(demo_stack, plain.sdk_http_response.headers["x-modelyard-task-id"])[5] == pytest.approx(
        (u.prompt_token_count * 1.25 + u.candidates_token_count * 5.0) / 1000)  # no search, no search price
