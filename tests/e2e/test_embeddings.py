"""Embeddings through a real Envoy: the `openai` SDK's `client.embeddings.create` (base64, its
default, and float) against an OpenAI-speaking and a Gemini-speaking demo upstream, Gemini's
`:embedContent` / `:batchEmbedContents` as client paths, routing by task type, rate limits,
metering and upstream failures in the caller's error shape."""

from __future__ import annotations

import urllib.request

import httpx
import numpy as np
import openai
import pytest

from adapters.embeddings import EmbeddingRequest, estimate_tokens
from devstack.demo.behaviour import DEMO_EMBED_DIMS, demo_embedding
from devstack.demo.faults import FAIL
from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row

pytestmark = pytest.mark.e2e

# model -> the cluster whose demo upstream answers it (and the protocol it speaks)
MODELS = {"demo-embed": "demo-openai-mini", "demo-embed-gemini": "demo-gemini"}


@pytest.fixture(scope="module")
def oai(demo_stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def _expected(texts: list[str], dims: int | None = None) -> np.ndarray:
    return np.array([demo_embedding(t, dims) for t in texts], np.float32)


def _metric(stack, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") and f'model="{model}"' in line)


@pytest.mark.parametrize("model", MODELS)
def test_sdk_default_base64(oai: openai.OpenAI, model: str) -> None:
    raw = oai.embeddings.with_raw_response.create(model=model, input="hello embedding world")
    out = raw.parse()
    assert raw.headers["x-modelyard-cluster"] == MODELS[model] and raw.headers["x-modelyard-model"] == model
    assert out.model == model and len(out.data) == 1 and out.data[0].index == 0
    assert np.array_equal(np.array(out.data[0].embedding, np.float32), _expected(["hello embedding world"])[0])
    assert len(out.data[0].embedding) == DEMO_EMBED_DIMS
    assert out.usage.prompt_tokens > 0 and out.usage.total_tokens == out.usage.prompt_tokens


@pytest.mark.parametrize("model", MODELS)
def test_sdk_float_list_and_dimensions(oai: openai.OpenAI, model: str) -> None:
    texts = ["first text", "second, longer text here", "third"]
    out = oai.embeddings.create(model=model, input=texts, encoding_format="float", dimensions=40)
    assert [d.index for d in out.data] == [0, 1, 2]
    got = np.array([d.embedding for d in out.data], np.float32)
    assert got.shape == (3, 40) and np.array_equal(got, _expected(texts, 40))


def test_usage_reported_or_estimated_and_metered(oai: openai.OpenAI, demo_stack) -> None:
    texts = ["one two three", "four five"]
    for model in MODELS:
        before = _metric(demo_stack, "modelyard_tokens_total", model)
        out = oai.embeddings.create(model=model, input=texts)
        if model == "demo-embed":  # the OpenAI demo reports usage (words); the client sees its count
            assert out.usage.prompt_tokens == 5
        else:  # Gemini reports none: the gateway's estimate is what the client sees and is metered
            assert out.usage.prompt_tokens == estimate_tokens(EmbeddingRequest(model, tuple(texts)))
        assert _metric(demo_stack, "modelyard_tokens_total", model) - before == out.usage.prompt_tokens


@pytest.mark.parametrize("model", MODELS)
def test_gemini_embed_content_client_path(demo_stack, model: str) -> None:
    r = httpx.post(f"{demo_stack.url}/v1beta/models/{model}:embedContent", timeout=10,
                   headers={"x-goog-api-key": DEMO_KEY},
                   json={"content": {"parts": [{"text": "gemini shaped"}]}, "taskType": "RETRIEVAL_QUERY"})
    assert r.status_code == 200, r.text
    assert r.headers["x-modelyard-cluster"] == MODELS[model]
    assert np.array_equal(np.array(r.json()["embedding"]["values"], np.float32), _expected(["gemini shaped"])[0])


@pytest.mark.parametrize("model", MODELS)
def test_gemini_batch_embed_contents_client_path(demo_stack, model: str) -> None:
    texts = ["alpha", "beta gamma"]
    body = {"requests": [{"model": f"models/{model}", "content": {"parts": [{"text": t}]},
                          "outputDimensionality": 12} for t in texts]}
    r = httpx.post(f"{demo_stack.url}/v1beta/models/{model}:batchEmbedContents?key={DEMO_KEY}", json=body,
                   timeout=10)
    assert r.status_code == 200, r.text
    got = np.array([e["values"] for e in r.json()["embeddings"]], np.float32)
    assert np.array_equal(got, _expected(texts, 12))


def test_gemini_client_error_in_gemini_shape(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1beta/models/demo-embed:batchEmbedContents", timeout=10,
                   headers={"x-goog-api-key": DEMO_KEY},
                   json={"requests": [{"model": "models/other", "content": {"parts": [{"text": "x"}]}}]})
    assert r.status_code == 400
    assert r.json()["error"]["status"] == "INVALID_ARGUMENT" and "must match" in r.json()["error"]["message"]


def test_routed_by_task_type(oai: openai.OpenAI) -> None:
    """A chat model cannot embed, and an embedding model cannot chat."""
    with pytest.raises(openai.APIStatusError) as e:
        oai.embeddings.create(model="demo-gpt", input="not an embedding model")
    assert e.value.status_code == 400 and "embedding" in str(e.value.body)
    with pytest.raises(openai.APIStatusError) as e2:
        oai.chat.completions.create(model="demo-embed", messages=[{"role": "user", "content": "hi"}])
    assert e2.value.status_code == 400


def test_token_arrays_are_a_clear_400(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model="demo-embed", input=[[1, 2, 3]])
    assert "token arrays" in str(e.value.body)


@pytest.mark.parametrize("model", MODELS)
def test_upstream_failure_is_a_502_in_openai_shape(oai: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        oai.embeddings.create(model=model, input=f"please {FAIL}")
    assert e.value.status_code == 502
    assert isinstance(e.value.body, dict) and e.value.body["type"] == "server_error"


def test_rate_limited_like_chat(demo_stack) -> None:
    """demo-limited's bucket holds 3 requests and refills 1/s: a burst of 6 meets a 429."""
    limited = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key="sk-modelyard-demo-limited", max_retries=0)
    statuses = []
    for _ in range(6):
        try:
            limited.embeddings.create(model="demo-embed", input="burst")
            statuses.append(200)
        except openai.RateLimitError as e:
            statuses.append(e.status_code)
            assert e.response.headers.get("retry-after")
    # Another test may have drained the shared bucket just before: only the refusal is certain.
    assert 429 in statuses and set(statuses) <= {200, 429}



@pytest.mark.parametrize("model", MODELS)
def test_metering_row(oai: openai.OpenAI, demo_stack, model: str) -> None:
    raw = oai.embeddings.with_raw_response.create(model=model, input=["metered text one", "and two"])
    out = raw.parse()
    cost = next(m.cost.input_per_1k for m in demo_stack.cfg.models if m.name == model)
    row = metered_row(demo_stack, raw.headers["x-modelyard-task-id"])
    assert row[:5] == (model, MODELS[model], 200, out.usage.prompt_tokens, 0)
    assert row[5] == pytest.approx(out.usage.prompt_tokens / 1000 * cost)


@pytest.mark.parametrize("model", MODELS)
def test_large_request_parsed_off_the_event_loop(oai: openai.OpenAI, model: str) -> None:
    """Past 64 KB the body is parsed and rendered in a worker thread; the answer is the same."""
    texts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 12 for i in range(300)]
    assert sum(map(len, texts)) > 64 * 1024
    out = oai.embeddings.create(model=model, input=texts)
    assert np.array_equal(np.array([d.embedding for d in out.data], np.float32), _expected(texts))


def test_an_input_past_the_context_window_is_a_400(oai: openai.OpenAI) -> None:
    """demo-embed-gemini holds 2048 tokens per input: one input of ~2500 is refused before it goes up."""
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model="demo-embed-gemini", input=["short", "word " * 2000])
    assert "context window" in str(e.value.body)
