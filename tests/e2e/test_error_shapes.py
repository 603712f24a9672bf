"""Errors say what each provider says for the same case, through a real Envoy and the SDKs: an
unknown URL or task id is a plain 404 (no `model_not_found`), an unknown model is `model_not_found`,
an upstream's own 400 is the caller's `invalid_request_error`, and an upstream failure names the task."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.conftest import DEMO_KEY

pytestmark = pytest.mark.e2e
AUTH = {"authorization": f"Bearer {DEMO_KEY}"}


def test_unknown_url_is_a_plain_404(demo_stack) -> None:
    r = httpx.post(f"{demo_stack.url}/v1/no-such-endpoint", headers=AUTH, json={}, timeout=10)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] is None, err


def test_unknown_task_is_a_plain_404(demo_stack) -> None:
    r = httpx.get(f"{demo_stack.url}/v1/tasks/0123456789abcdef", headers=AUTH, timeout=10)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["code"] is None and err["type"] == "invalid_request_error", err


def test_unknown_model_is_model_not_found_in_each_shape(demo_stack) -> None:
    oai = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert isinstance(e.value.body, dict) and e.value.body["code"] == "model_not_found"
    assert e.value.body["type"] == "invalid_request_error"
    ant = anthropic.Anthropic(base_url=demo_stack.url, api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(anthropic.NotFoundError) as a:
        ant.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert a.value.body["error"]["type"] == "not_found_error"  # Anthropic's own type for it


def test_upstream_400_is_the_callers_invalid_request(demo_stack) -> None:
    oai = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model="demo-embed", input="hello", dimensions=5000)
    assert isinstance(e.value.body, dict) and e.value.body["type"] == "invalid_request_error", e.value.body


def test_upstream_failure_names_the_task(demo_stack) -> None:
    oai = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as e:
        oai.chat.completions.create(model="demo-claude", messages=[{"role": "user", "content": "demo-fail-500"}])
    task = e.value.response.headers["x-modelyard-task-id"]
    assert e.value.status_code == 502 and f"(task {task})" in e.value.message
