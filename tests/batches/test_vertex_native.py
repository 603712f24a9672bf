"""Native batches on Vertex AI batch prediction, pure: each line as `{"request": <Gemini body>}`
with its line number in the request's labels, the job's request and where its predictions are read
(extproc/batches/vertex_jobs.py), and the predictions read back by line in the caller's protocol."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from contracts.config import BatchesConfig, Deployment, TasksConfig, parse_config
from extproc.batches import native, vertex_jobs
from extproc.batches.desk import BatchDesk
from extproc.batches.native import NativeTarget
from extproc.tasks.board import TaskBoard
from extproc.tasks.marker import ReplayMarker
from extproc.tasks.store import SqliteTaskStore

VERTEX = NativeTarget("gw-gemini", "c-vertex", "vertex", "gemini-2.0-flash-001")
CHAT = orjson.dumps({"model": "gw-gemini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16})


def _dep(**batch: object) -> Deployment:
    return Deployment.model_validate({
        "cluster": "c-vertex", "protocol": "vertex", "endpoints": ["us-central1-aiplatform.googleapis.com:443"],
        "tls": True, "upstream_model": VERTEX.upstream_model, "vertex": {"project": "p1", "location": "us-central1"},
        "batch": {"mode": "native", "bucket": "my-batches", **batch}})


def test_lines_are_gemini_requests_labelled_with_their_line() -> None:
    body = native.render_line("openai", VERTEX, CHAT)
    assert body["contents"][0]["parts"][0]["text"] == "hi" and body["generationConfig"]["maxOutputTokens"] == 16
    rows = [orjson.loads(x) for x in native.vertex_input([(3, body)]).splitlines()]
    assert rows[0]["request"]["labels"] == {"modelyard_line": "3"} and rows[0]["request"]["contents"]


def _prediction(line: str, text: str | None, status: str = "") -> bytes:
    row: dict = {"request": {"contents": [], "labels": {"modelyard_line": line}}, "status": status}
    if text is not None:
        row["response"] = {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                                           "finishReason": "STOP"}],
                           "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 2, "totalTokenCount": 7}}
    return orjson.dumps(row)


def test_predictions_map_back_by_line() -> None:
    out = b"\n".join([_prediction("1", "yes"), _prediction("2", None, "Invalid argument: contents"),
                      orjson.dumps({"request": {"contents": []}, "response": {}}), b"not json"])
    got = native.vertex_results("openai", VERTEX, out, "JOB_STATE_SUCCEEDED", [1, 2, 4])
    assert set(got) == {1, 2}
    ok = orjson.loads(got[1].body or b"")
    assert ok["object"] == "chat.completion" and ok["model"] == "gw-gemini"
    assert ok["choices"][0]["message"]["content"] == "yes" and got[1].usage is not None
    assert got[2].kind == "failed" and got[2].status == 400
    assert "Invalid argument" in orjson.loads(got[2].body or b"")["error"]["message"]
    cancelled = native.vertex_results("anthropic", VERTEX, b"", "JOB_STATE_CANCELLED", [7])
    assert cancelled[7].kind == "cancelled"
    assert native.ended("vertex", {"state": "JOB_STATE_SUCCEEDED"}) and not native.ended("vertex", {"state": "JOB_STATE_RUNNING"})


def test_the_job_request_and_where_its_predictions_are_read() -> None:
    dep = _dep(prefix="vb/")
    job = vertex_jobs.job_request(dep, "batch_abc")
    assert job["model"] == "publishers/google/models/gemini-2.0-flash-001"
    assert job["inputConfig"] == {"instancesFormat": "jsonl", "gcsSource": {"uris": ["gs://my-batches/vb/batch_abc/input.jsonl"]}}
    assert job["outputConfig"]["gcsDestination"]["outputUriPrefix"] == "gs://my-batches/vb/batch_abc/output"
    done = {"outputInfo": {"gcsOutputDirectory": "gs://my-batches/vb/batch_abc/output/prediction-model-1"}}
    assert vertex_jobs.output_prefix(dep, done) == "vb/batch_abc/output/prediction-model-1/"
    assert vertex_jobs.output_prefix(dep, {"outputInfo": {"gcsOutputDirectory": "gs://elsewhere/x"}}) is None
    assert vertex_jobs.control_endpoint(dep) == "https://us-central1-aiplatform.googleapis.com"
    assert vertex_jobs.gcs_endpoint(dep) == "https://storage.googleapis.com"
    assert vertex_jobs.job_path("projects/p1/locations/us-central1/batchPredictionJobs/42") \
        == "/v1/projects/p1/locations/us-central1/batchPredictionJobs/42"


def test_a_native_vertex_batch_needs_a_bucket_and_gemini() -> None:
    with pytest.raises(ValidationError, match="bucket"):
        Deployment.model_validate({"cluster": "c", "protocol": "vertex", "endpoints": ["127.0.0.1:1"],
                                   "vertex": {"project": "p", "location": "l"}, "batch": {"mode": "native"}})
    with pytest.raises(ValidationError, match="publisher google"):
        Deployment.model_validate({"cluster": "c", "protocol": "vertex", "endpoints": ["127.0.0.1:1"],
                                   "vertex": {"project": "p", "location": "l", "publisher": "anthropic"},
                                   "batch": {"mode": "native", "bucket": "b-1"}})


def test_a_shared_cluster_gives_each_model_its_own_deployment(tmp_path: Path) -> None:
    # demo-vertex serves a chat model and the batch model: the batch reads its own model's `batch:`.
    plain = {"cluster": "c-vertex", "protocol": "vertex", "endpoints": ["127.0.0.1:1"],
             "upstream_model": "gemini-2.0-flash-001", "vertex": {"project": "p", "location": "l"}}
    config = parse_config({
        "listener": {"address": "127.0.0.1", "port": 1},
        "tenants": [{"name": "acme", "api_keys": ["0" * 64]}],
        "models": [{"name": "chat", "deployments": [plain]},
                   {"name": "batch", "deployments": [{**plain, "batch": {"mode": "native", "bucket": "b-1"}}]}]})
    tasks = TasksConfig(sqlite_path=str(tmp_path / "tasks.sqlite"))
    board = TaskBoard(tasks, "http://127.0.0.1:1", SqliteTaskStore(tasks.sqlite_path), ReplayMarker(None), {})
    desk = BatchDesk(BatchesConfig(sqlite_path=str(tmp_path / "batches.sqlite")), board, config=config)
    dep = desk._deployment("c-vertex", "batch")
    assert dep is not None and dep.batch is not None and dep.batch.bucket == "b-1"
    assert config.clusters()["c-vertex"].batch is None  # what a lookup by cluster alone would have read
    asyncio.run(desk.close())
