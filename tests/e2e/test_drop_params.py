"""drop_params through a real Envoy with real clients: a control the deployment's protocol cannot
express is a 400 naming it by default (Gemini's documented `topK` to an OpenAI deployment, the
openai SDK's `seed` to an Anthropic one); with the policy the request succeeds, the reply names what
was dropped (`x-modelyard-dropped-params`) and `modelyard_dropped_params_total` counts it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY
from tests.e2e import params_stack

pytestmark = pytest.mark.e2e

DROPPED = "modelyard_dropped_params_total"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with params_stack.start(tmp_path_factory.mktemp("params")) as s:
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
