"""Batches passed through to Vertex AI batch prediction (docs/batches.md "Vertex"), through a real
Envoy with the openai and anthropic SDKs, on the shipped `demo-gemini-vertex-batch`: the gateway
uploads `{"request": <Gemini body>}` lines to the demo Vertex's Cloud Storage stand-in (its JSON API,
behind the demo's OAuth2 tokens), creates a batchPredictionJob, polls it, and reads its
predictions back as its own output files; each line metered at the batch price; a cancel reaches
the job. One stack for the module."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import time

import anthropic
import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
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
    before = os.environ.get("MODELYARD_DEMO_BATCH_SECONDS")
    os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = "1.0"
    try:
        with start_stack(workdir, data, shared_demos=True) as s:
            yield s
    finally:
        if before is None:
            os.environ.pop("MODELYARD_DEMO_BATCH_SECONDS", None)
        else:
            os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = before


def _line(custom_id: str, text: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 32}})


def _batch(oai: openai.OpenAI, lines: list[str]):
    f = oai.files.create(file=("in.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch")
    return oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def _until_done(oai: openai.OpenAI, batch_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while (b := oai.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, b
        time.sleep(0.2)
    return b


def _jsonl(raw: bytes) -> list[dict]:
    return [json.loads(x) for x in raw.decode().splitlines() if x.strip()]


def _metered(stack, batch_id: str, n: int) -> list[tuple]:
    rows: list = []
    deadline = time.monotonic() + 10
    while len(rows) < n and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            rows = db.execute("SELECT task_id, model, status, input_tokens, output_tokens, cost, strategy FROM "
                              "requests WHERE task_id LIKE ? ORDER BY task_id", (batch_id + "-%",)).fetchall()
        time.sleep(0.1)
    return rows


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
