"""Batches passed through to Vertex AI batch prediction (docs/batches.md "Vertex"), through a real
Envoy with the openai and anthropic SDKs, on the shipped `demo-gemini-vertex-batch`: the gateway
uploads `{"request": <Gemini body>}` lines to the demo Vertex's Cloud Storage stand-in (its JSON API,
behind the demo's OAuth2 tokens), creates a batchPredictionJob, polls it, and reads its
predictions back as its own output files; each line metered at the batch price; a cancel reaches
the job. One stack for the module."""

from __future__ import annotations

import os
import time

import anthropic
import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.e2e.batch_calls import chat_line, demo_batch_seconds
from tests.e2e.batch_calls import jsonl as _jsonl
from tests.e2e.batch_calls import metered as _metered
from tests.e2e.batch_calls import openai_batch as _batch
from tests.e2e.batch_calls import until_done as _until_done
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

MODEL = "demo-gemini-vertex-batch"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("vertex-batches")
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"] if m["name"] == MODEL]
    data.pop("ratelimit", None)
    for m in data["models"]:  # its own service-account file (the demo writes one), not the shared run/ one
        m["deployments"][0]["vertex"]["credentials_file"] = str(workdir / "vertex-sa.json")
        m["deployments"][0]["batch"]["poll_every_s"] = 0.2
    data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite")}
    data["extproc"]["batches"] = {"sqlite_path": str(workdir / "batches.sqlite"), "finalize_every_s": 0.2}
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with demo_batch_seconds("1.0"), start_stack(workdir, data, shared_demos=True) as s:
        yield s


def _line(custom_id: str, text: str) -> str:
    return chat_line(custom_id, MODEL, text)


def test_an_openai_batch_runs_as_a_vertex_batch_prediction_job(stack) -> None:
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    batch = _batch(oai, [_line("a", "vertex one"), "{oops", _line("b", "vertex two")])
    assert batch.status == "in_progress"
    done = _until_done(oai, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    out = {r["custom_id"]: r for r in _jsonl(oai.files.content(done.output_file_id or "").content)}
    assert set(out) == {"a", "b"}
    body = out["b"]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == MODEL
    assert body["choices"][0]["message"]["content"].endswith("vertex two")  # Gemini's answer, translated back
    assert out["b"]["id"] == f"batch_req_{batch.id}-3"
    assert [e["error"]["code"] for e in _jsonl(oai.files.content(done.error_file_id or "").content)] \
        == ["invalid_json_line"]
    rows = _metered(stack, batch.id, 2)
    assert [(r[1], r[2], r[6]) for r in rows] == [(MODEL, 200, "native-batch")] * 2
    for _, _, _, tin, tout, cost, _ in rows:  # at the batch price: half of 1.25 / 5.0 per 1k
        assert tin > 0 and tout > 0 and cost == pytest.approx((tin * 1.25 + tout * 5.0) / 1000 * 0.5)


def test_an_anthropic_message_batch_runs_translated_on_vertex(stack) -> None:
    anth = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    mb = anth.messages.batches.create(requests=[{"custom_id": "g1", "params": {
        "model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": "claude caller, gemini job"}]}}])
    deadline = time.monotonic() + 60
    while (mb := anth.messages.batches.retrieve(mb.id)).processing_status != "ended":
        assert time.monotonic() < deadline, mb
        time.sleep(0.2)
    (result,) = list(anth.messages.batches.results(mb.id))
    assert result.custom_id == "g1" and result.result.type == "succeeded"
    message = result.result.message  # type: ignore[union-attr]
    assert message.model == MODEL and message.content[0].text.endswith("claude caller, gemini job")  # type: ignore[union-attr]
    assert [r[6] for r in _metered(stack, mb.id, 1)] == ["native-batch"]


def test_a_cancel_reaches_the_vertex_job(stack) -> None:
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    # demo-hold-10000: the job stays running until the cancel reaches it, however busy the box
    batch = _batch(oai, [_line("x1", "never demo-hold-10000"), _line("x2", "nor me")])
    assert oai.batches.cancel(batch.id).status == "cancelling"
    done = _until_done(oai, batch.id)
    assert done.status == "cancelled" and done.request_counts is not None and done.request_counts.completed == 0
    errors = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert sorted(e["custom_id"] for e in errors) == ["x1", "x2"]
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
