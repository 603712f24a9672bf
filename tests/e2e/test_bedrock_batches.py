"""Batches passed through to Bedrock batch inference (docs/batches.md "Bedrock"), through a real
Envoy with the openai SDK: an OpenAI batch on a Bedrock Claude deployment is written as Bedrock's
`{recordId, modelInput}` JSONL to moto's S3 server (tests/moto_s3.py, each request's SigV4 checked),
run by the demo Bedrock's job API (CreateModelInvocationJob / Get / Stop, SigV4-checked too) that
reads and writes the same bucket, and read back from the job's `.jsonl.out` as the gateway's own
output and error files; each line metered at the batch price; a cancel stops the job. One stack."""

from __future__ import annotations

import json
import os
import time

import anthropic
import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.e2e.batch_calls import chat_line
from tests.e2e.batch_calls import jsonl as _jsonl
from tests.e2e.batch_calls import metered as _metered
from tests.e2e.batch_calls import openai_batch as _batch
from tests.e2e.batch_calls import until_done as _until_done
from tests.moto_s3 import moto_s3
from tests.stack_config import demo_config_free_ports, free_port, start_stack

pytestmark = pytest.mark.e2e

MODEL = "demo-claude-bedrock-batch"
UPSTREAM = "anthropic.claude-3-5-sonnet-20240620-v1:0"
OTHER_KEY = "sk-modelyard-demo-l2"  # tenant demo-l2
BAD_MODEL = "demo-claude-bedrock-batch-badcreds"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("bedrock-batches")
    before = os.environ.get("MODELYARD_DEMO_BATCH_SECONDS")
    os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = "1.0"
    try:
        with moto_s3("modelyard-bedrock-batches") as s3:
            # One AWS identity, as in an account: the gateway signs Bedrock and S3 with it, the demo
            # Bedrock checks signatures against it and reads and writes the bucket as it.
            creds = workdir / "aws-credentials"
            creds.write_text(f"[modelyard-demo]\naws_access_key_id = {s3.access_key}\n"
                             f"aws_secret_access_key = {s3.secret_key}\n")
            data, _ = demo_config_free_ports()
            data["models"] = [{
                "name": MODEL, "task_types": ["chat"], "cost": {"input_per_1k": 3.0, "output_per_1k": 15.0,
                                                              "batch_discount": 0.5},
                "deployments": [{
                    "cluster": "demo-bedrock-batch", "protocol": "bedrock", "endpoints": [f"127.0.0.1:{free_port()}"],
                    "upstream_model": UPSTREAM,
                    "bedrock": {"region": "us-east-1", "profile": "modelyard-demo", "credentials_file": str(creds)},
                    # min_records 2: a one-line batch is replayed (Bedrock's own minimum is 100)
                    "batch": {"mode": "native", "poll_every_s": 0.2, "bucket": s3.bucket, "prefix": "jobs/",
                              "min_records": 2,
                              "role_arn": "arn:aws:iam::000000000000:role/modelyard-batch",
                              "s3_endpoint": s3.endpoint}}]}]
            # The same deployment with a secret S3 does not know: its job input is refused (SignatureDoesNotMatch).
            wrong = workdir / "aws-credentials-wrong"
            wrong.write_text(f"[modelyard-demo]\naws_access_key_id = {s3.access_key}\n"
                             f"aws_secret_access_key = not-{s3.secret_key}\n")
            bad = json.loads(json.dumps(data["models"][0]))
            bad["name"] = BAD_MODEL
            bad["deployments"][0].update(cluster="demo-bedrock-batch-bad", endpoints=[f"127.0.0.1:{free_port()}"])
            bad["deployments"][0]["bedrock"]["credentials_file"] = str(wrong)
            data["models"].append(bad)
            data.pop("ratelimit", None)
            data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite")}
            data["extproc"]["batches"] = {"sqlite_path": str(workdir / "batches.sqlite"), "finalize_every_s": 0.2}
            for name, value in UPSTREAM_KEYS.items():
                os.environ.setdefault(name, value)
            with start_stack(workdir, data, shared_demos=True) as s:
                yield s, s3
    finally:
        if before is None:
            os.environ.pop("MODELYARD_DEMO_BATCH_SECONDS", None)
        else:
            os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = before


def _line(custom_id: str, text: str, model: str = MODEL) -> str:
    return chat_line(custom_id, model, text)


def test_an_openai_batch_runs_as_a_bedrock_batch_inference_job(stack) -> None:
    s, s3 = stack
    oai = openai.OpenAI(base_url=f"{s.url}/v1", api_key=DEMO_KEY, max_retries=0)
    batch = _batch(oai, [_line("a", "bedrock one"), "{oops", _line("b", "bedrock two")])
    assert batch.status == "in_progress" and batch.request_counts is not None and batch.request_counts.total == 3
    # The job's input is in the bucket: Bedrock's records, the model's native body (Claude's Messages).
    records = _jsonl(s3.client().get_object(Bucket=s3.bucket, Key=f"jobs/{batch.id}/input.jsonl")["Body"].read())
    assert [r["recordId"] for r in records] == ["L0000000001", "L0000000003"]
    assert records[0]["modelInput"]["anthropic_version"] == "bedrock-2023-05-31"
    assert "model" not in records[0]["modelInput"] and "custom_id" not in json.dumps(records)
    assert records[0]["modelInput"]["messages"] == [{"role": "user", "content": "bedrock one"}]
    done = _until_done(oai, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    # The job wrote its results where Bedrock does: <output prefix><job id>/<input name>.out
    assert any(k.startswith(f"jobs/{batch.id}/output/") and k.endswith("/input.jsonl.out") for k in s3.object_keys())
    out = {r["custom_id"]: r for r in _jsonl(oai.files.content(done.output_file_id or "").content)}
    assert set(out) == {"a", "b"}
    body = out["b"]["response"]["body"]
    assert body["object"] == "chat.completion" and body["model"] == MODEL  # translated back, the gateway's name
    assert body["choices"][0]["message"]["content"].endswith("bedrock two")
    assert out["b"]["id"] == f"batch_req_{batch.id}-3" and out["b"]["response"]["status_code"] == 200
    errors = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert [e["error"]["code"] for e in errors] == ["invalid_json_line"]
    rows = _metered(s, batch.id, 2)
    assert [(r[1], r[2], r[6]) for r in rows] == [(MODEL, 200, "native-batch")] * 2
    for _, _, _, tin, tout, cost, _ in rows:  # at the batch price: half of 3.0 / 15.0 per 1k
        assert tin > 0 and tout > 0 and cost == pytest.approx((tin * 3.0 + tout * 15.0) / 1000 * 0.5)
    other = openai.OpenAI(base_url=f"{s.url}/v1", api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)


def test_an_anthropic_message_batch_runs_on_bedrock_untranslated(stack) -> None:
    s, s3 = stack
    anth = anthropic.Anthropic(base_url=s.url, api_key=DEMO_KEY, max_retries=0)
    mb = anth.messages.batches.create(requests=[{"custom_id": f"m{i}", "params": {
        "model": MODEL, "max_tokens": 32, "messages": [{"role": "user", "content": f"claude on bedrock {i}"}]}}
        for i in (1, 2)])
    deadline = time.monotonic() + 60
    while (mb := anth.messages.batches.retrieve(mb.id)).processing_status != "ended":
        assert time.monotonic() < deadline, mb
        time.sleep(0.2)
    results = list(anth.messages.batches.results(mb.id))
    assert [(r.custom_id, r.result.type) for r in results] == [("m1", "succeeded"), ("m2", "succeeded")]
    message = results[1].result.message  # type: ignore[union-attr]
    assert message.model == MODEL and message.content[0].text.endswith("claude on bedrock 2")  # type: ignore[union-attr]
    assert f"jobs/{mb.id}/input.jsonl" in s3.object_keys()
    assert [r[6] for r in _metered(s, mb.id, 2)] == ["native-batch"] * 2


def test_a_batch_under_the_job_minimum_is_replayed_line_by_line(stack) -> None:
    s, s3 = stack
    oai = openai.OpenAI(base_url=f"{s.url}/v1", api_key=DEMO_KEY, max_retries=0)
    done = _until_done(oai, _batch(oai, [_line("solo", "just me")]).id)
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 1
    (row,) = _jsonl(oai.files.content(done.output_file_id or "").content)
    assert row["response"]["body"]["choices"][0]["message"]["content"].endswith("just me")
    assert not any(k.startswith(f"jobs/{done.id}/") for k in s3.object_keys())  # no job: Converse, line by line
    (metered,) = _metered(s, done.id, 1)
    assert metered[6] != "native-batch"


def test_a_cancel_stops_the_bedrock_job(stack) -> None:
    s, _ = stack
    oai = openai.OpenAI(base_url=f"{s.url}/v1", api_key=DEMO_KEY, max_retries=0)
    # demo-hold-10000: the job stays in progress until the stop reaches it, however busy the box
    batch = _batch(oai, [_line("x1", "never demo-hold-10000"), _line("x2", "nor me")])
    assert oai.batches.cancel(batch.id).status == "cancelling"
    done = _until_done(oai, batch.id)
    assert done.status == "cancelled" and done.request_counts is not None and done.request_counts.completed == 0
    errors = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert sorted(e["custom_id"] for e in errors) == ["x1", "x2"]
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)


def test_a_bucket_that_refuses_the_input_is_a_503_and_nothing_is_stored(stack) -> None:
    s, s3 = stack
    oai = openai.OpenAI(base_url=f"{s.url}/v1", api_key=DEMO_KEY, max_retries=0)
    objects, batches = s3.object_keys(), [b.id for b in oai.batches.list(limit=100).data]
    with pytest.raises(openai.InternalServerError) as e:
        _batch(oai, [_line("a", "refused", BAD_MODEL), _line("b", "refused too", BAD_MODEL)])
    assert e.value.status_code == 503 and e.value.response.headers.get("retry-after")
    assert s3.object_keys() == objects  # the bucket refused the input: no job, no record
    assert [b.id for b in oai.batches.list(limit=100).data] == batches
