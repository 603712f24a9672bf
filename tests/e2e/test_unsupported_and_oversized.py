"""Through a real Envoy with real clients (one stack for both):

drop_params: a control the deployment's protocol cannot express is a 400 naming it by default
(Gemini's documented `topK` to an OpenAI deployment, the openai SDK's `seed` to an Anthropic one);
with the policy the request succeeds, the reply names what was dropped (`x-modelyard-dropped-params`)
and `modelyard_dropped_params_total` counts it.

Large answers: a 2048 x 1536 embeddings answer translated (in a worker thread) while small calls go
on; answers past `extproc.max_body_bytes` passed through untranslated where the protocols match, a
502 in the caller's shape naming the limit where they would need translating.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest

from devstack.demo.behaviour import demo_embedding
from tests.conftest import DEMO_KEY
from tests.e2e import params_stack

pytestmark = pytest.mark.e2e

DROPPED = "modelyard_dropped_params_total"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with params_stack.chunked_upstream() as chunked, \
            params_stack.start(tmp_path_factory.mktemp("params"), chunked.port) as s:
        yield s


def _gemini(stack: Any, model: str) -> httpx.Response:
    # Google's documented generateContent example: generationConfig with topK.
    body = {"contents": [{"role": "user", "parts": [{"text": "Write a story about a magic backpack."}]}],
            "generationConfig": {"temperature": 1.0, "topP": 0.8, "topK": 10, "maxOutputTokens": 64}}
    return httpx.post(f"{stack.url}/v1beta/models/{model}:generateContent", json=body,
                      headers={"x-goog-api-key": DEMO_KEY}, timeout=30)


def test_gemini_topk_to_an_openai_deployment_is_a_400_naming_it(stack: Any) -> None:
    r = _gemini(stack, "demo-gpt")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["status"] == "INVALID_ARGUMENT" and err["code"] == 400
    assert "generationConfig.topK" in err["message"] and "OpenAI" in err["message"]
    assert "x-modelyard-dropped-params" not in r.headers


def test_gemini_topk_dropped_by_the_model_policy(stack: Any) -> None:
    labels = {"model": "demo-gpt-drop", "deployment": "demo-openai", "param": "top_k"}
    before = params_stack.metric(stack, DROPPED, labels)
    r = _gemini(stack, "demo-gpt-drop")
    assert r.status_code == 200, r.text
    assert r.json()["candidates"][0]["content"]["parts"][0]["text"]
    assert r.headers["x-modelyard-dropped-params"] == "top_k"
    assert r.headers["x-modelyard-cluster"] == "demo-openai"
    assert params_stack.metric(stack, DROPPED, labels) == before + 1


@pytest.fixture(scope="module")
def oai(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)


def test_openai_sdk_seed_to_an_anthropic_deployment_is_a_400_naming_it(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="demo-claude", messages=[{"role": "user", "content": "hi"}],
                                    seed=7, extra_body={"top_k": 3})
    assert e.value.status_code == 400
    assert "seed is not supported by this model's Anthropic deployment" in e.value.message


def test_openai_sdk_seed_dropped_by_the_deployment_policy(stack: Any, oai: openai.OpenAI) -> None:
    labels = {"model": "demo-claude-drop", "deployment": "demo-anthropic", "param": "seed"}
    before = params_stack.metric(stack, DROPPED, labels)
    # top_k (extra_body: not an OpenAI parameter) is one Anthropic has: carried, not dropped.
    raw = oai.chat.completions.with_raw_response.create(
        model="demo-claude-drop", messages=[{"role": "user", "content": "hi"}], seed=7, extra_body={"top_k": 3})
    out = raw.parse()
    assert out.choices[0].message.content and out.model == "demo-claude-drop"
    assert raw.headers["x-modelyard-dropped-params"] == "seed"
    assert params_stack.metric(stack, DROPPED, labels) == before + 1
    assert params_stack.metric(stack, DROPPED, {**labels, "param": "top_k"}) == 0


def test_the_deployment_list_refuses_what_it_does_not_name(stack: Any) -> None:
    # demo-claude-drop drops seed only; an Anthropic upstream takes top_k, so ask it something else:
    # the same policy with a Gemini caller's seed is dropped, spelled the gateway's way in the header.
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"seed": 5}}
    r = httpx.post(f"{stack.url}/v1beta/models/demo-claude-drop:generateContent", json=body,
                   headers={"x-goog-api-key": DEMO_KEY}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["x-modelyard-dropped-params"] == "seed"
    r = httpx.post(f"{stack.url}/v1beta/models/demo-claude:generateContent", json=body,
                   headers={"x-goog-api-key": DEMO_KEY}, timeout=30)
    assert r.status_code == 400 and "generationConfig.seed" in r.json()["error"]["message"]


# -- large answers (docs/performance.md, "Large bodies") ------------------------------------------
OVER_LIMIT = "modelyard_answers_over_limit_total"
BIG_INPUTS = [f"large answer input {i}" for i in range(2048)]


def _expected(texts: list[str], dims: int) -> np.ndarray:
    return np.array([demo_embedding(t, dims) for t in texts], np.float32)


def test_a_2048x1536_embeddings_answer_is_translated_while_small_calls_go_on(stack: Any, oai: openai.OpenAI) -> None:
    """OpenAI client, Gemini deployment: a ~30 MB batchEmbedContents answer becomes OpenAI's base64
    answer (in a worker thread); chat calls sent meanwhile are answered, and correctly."""
    small: list[str] = []
    with ThreadPoolExecutor(1) as pool:
        big = pool.submit(oai.embeddings.with_raw_response.create, model="demo-embed-gemini", input=BIG_INPUTS,
                          dimensions=1536, timeout=120)
        while not big.done() and len(small) < 40:  # bounded: the big call ends or 40 small ones did
            r = oai.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": f"ping {len(small)}"}])
            small.append(r.choices[0].message.content or "")
        raw = big.result()
    assert small and all(s.endswith(f"ping {i}") for i, s in enumerate(small)), small[:3]
    out = raw.parse()
    assert raw.headers["x-modelyard-cluster"] == "demo-gemini"
    got = np.array([d.embedding for d in out.data], np.float32)
    assert got.shape == (2048, 1536) and [d.index for d in out.data] == list(range(2048))
    rows = [0, 1, 1023, 2047]
    assert np.array_equal(got[rows], _expected([BIG_INPUTS[i] for i in rows], 1536))


def test_past_max_body_bytes_same_protocol_passes_through_untranslated(stack: Any, oai: openai.OpenAI) -> None:
    """OpenAI client, OpenAI deployment, a ~35 MB float answer: Envoy streams it on as the upstream sent it."""
    labels = {"model": "demo-embed", "outcome": "passthrough"}
    before = params_stack.metric(stack, OVER_LIMIT, labels)
    raw = oai.embeddings.with_raw_response.create(model="demo-embed", input=BIG_INPUTS, dimensions=1800,
                                                  encoding_format="float", timeout=120)
    assert int(raw.headers["content-length"]) > params_stack.MAX_BODY_BYTES
    out = orjson.loads(raw.http_response.content)  # the upstream's bytes; pydantic models of 3.7M floats are slow
    assert len(out["data"]) == 2048 and len(out["data"][0]["embedding"]) == 1800
    assert np.array_equal(np.array(out["data"][-1]["embedding"], np.float32), _expected([BIG_INPUTS[-1]], 1800)[0])
    assert params_stack.metric(stack, OVER_LIMIT, labels) == before + 1


def test_past_max_body_bytes_to_translate_is_a_502_naming_the_limit(stack: Any, oai: openai.OpenAI) -> None:
    """OpenAI client, Gemini deployment, a ~35 MB answer to translate: a 502 in OpenAI's shape."""
    labels = {"model": "demo-embed-gemini", "outcome": "refused"}
    before = params_stack.metric(stack, OVER_LIMIT, labels)
    with pytest.raises(openai.APIStatusError) as e:
        oai.embeddings.create(model="demo-embed-gemini", input=BIG_INPUTS, dimensions=1800, timeout=120)
    assert e.value.status_code == 502
    assert "max_body_bytes" in e.value.message and str(params_stack.MAX_BODY_BYTES) in e.value.message
    assert e.value.response.headers["x-modelyard-task-id"]
    assert "x-modelyard-upstream-host" not in e.value.response.headers
    assert params_stack.metric(stack, OVER_LIMIT, labels) == before + 1


def test_past_max_body_bytes_gemini_caller_gets_its_own_shape(stack: Any) -> None:
    """The same refusal for a Gemini caller of the OpenAI deployment, in Gemini's error shape."""
    body = {"requests": [{"model": "models/demo-embed", "content": {"parts": [{"text": t}]},
                          "outputDimensionality": 1800} for t in BIG_INPUTS]}
    r = httpx.post(f"{stack.url}/v1beta/models/demo-embed:batchEmbedContents", json=body,
                   headers={"x-goog-api-key": DEMO_KEY}, timeout=120)
    assert r.status_code == 502, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == 502 and "max_body_bytes" in err["message"]



@pytest.mark.parametrize("model", ["chunky-openai", "chunky-gemini"])
def test_a_chunked_answer_past_envoys_buffer_is_a_502_naming_the_limit(stack: Any, model: str) -> None:
    """No content-length: Envoy buffers until its own limit and fails the answer itself (details
    `response_payload_too_large`: a plain-text 500 as shipped); the listener's local-reply mapper makes
    it a 502 JSON error naming the limit that OpenAI's, Anthropic's and Gemini's parsers all read."""
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], timeout=60)
    assert e.value.status_code == 502 and "buffer_limit_bytes" in e.value.message
    assert str(params_stack.ENVOY_BUFFER_BYTES) in e.value.message
    gem = httpx.post(f"{stack.url}/v1beta/models/{model}:generateContent", headers={"x-goog-api-key": DEMO_KEY},
                     json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, timeout=60)
    assert gem.status_code == 502, gem.text[:300]
    err = gem.json()["error"]
    assert err["code"] == 502 and err["status"] == "INTERNAL" and "buffer_limit_bytes" in err["message"]


@pytest.mark.parametrize("model", ["chunky-openai", "chunky-gemini"])
def test_a_chunked_answer_that_fits_is_served_as_before(oai: openai.OpenAI, model: str) -> None:
    raw = oai.chat.completions.with_raw_response.create(model=model, messages=[{"role": "user", "content": "small"}])
    assert raw.parse().choices[0].message.content == "[chunked] small"
    assert raw.headers["x-modelyard-cluster"] == model
    if model == "chunky-gemini":
        # translated: on the duplex chat path Envoy sends a rewritten body chunked (it drops any length on a
        # duplex body); a length, where one comes, is the new body's
        assert raw.headers.get("content-length") in (None, str(len(raw.http_response.content)))
        assert raw.headers.get("transfer-encoding") == "chunked" or "content-length" in raw.headers
