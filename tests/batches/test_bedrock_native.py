"""Native batches on Bedrock batch inference, pure: each line as a `{recordId, modelInput}` record in
Claude's InvokeModel body (translated from OpenAI's chat), the job's request and output key
(extproc/batches/bedrock_jobs.py), and its `.jsonl.out` records read back by line in the caller's
protocol, as AWS documents them; the deployment's `batch:` settings checked at load."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from contracts.config import Deployment
from extproc.batches import bedrock_jobs, native
from extproc.batches.native import NativeTarget

BEDROCK = NativeTarget("gw-claude", "c-bedrock", "bedrock", "anthropic.claude-3-5-haiku-20241022-v1:0")
CHAT = orjson.dumps({"model": "gw-claude", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                     "stream": False})
MESSAGES = orjson.dumps({"model": "gw-claude", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]})


def _dep(**batch: object) -> Deployment:
    return Deployment.model_validate({
        "cluster": "c-bedrock", "protocol": "bedrock", "endpoints": ["bedrock-runtime.eu-west-1.amazonaws.com:443"],
        "tls": True, "upstream_model": BEDROCK.upstream_model, "bedrock": {"region": "eu-west-1"},
        "batch": {"mode": "native", "bucket": "my-batches", "role_arn": "arn:aws:iam::123456789012:role/batch",
                  **batch}})


def test_lines_are_claude_invoke_bodies_without_the_model() -> None:
    for api, body in (("openai", CHAT), ("anthropic", MESSAGES)):
        rec = native.render_line(api, BEDROCK, body)
        assert rec["anthropic_version"] == "bedrock-2023-05-31" and rec["max_tokens"] == 16
        assert "model" not in rec and "stream" not in rec and rec["messages"][0]["role"] == "user"
    rows = [orjson.loads(x) for x in native.bedrock_input([(1, {"a": 1}), (12, {"b": 2})]).splitlines()]
    assert rows == [{"recordId": "L0000000001", "modelInput": {"a": 1}},
                    {"recordId": "L0000000012", "modelInput": {"b": 2}}]


def test_only_claude_models_run_natively_on_bedrock() -> None:
    assert native.bedrock_native("anthropic.claude-3-5-sonnet-20240620-v1:0")
    assert native.bedrock_native("us.anthropic.claude-3-7-sonnet-20250219-v1:0")
    assert not native.bedrock_native("meta.llama3-70b-instruct-v1:0")


def _message(text: str) -> dict:
    return {"id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 9, "output_tokens": 4}}


def test_output_records_map_back_by_line() -> None:
    out = b"\n".join([
        orjson.dumps({"recordId": "L0000000001", "modelInput": {}, "modelOutput": _message("yes")}),
        orjson.dumps({"recordId": "L0000000002", "modelInput": {},
                      "error": {"errorCode": 400, "errorMessage": "Malformed input request"}}),
        orjson.dumps({"recordId": "someone-else", "modelOutput": _message("ignored")}),
        b"not json"])
    got = native.bedrock_results("openai", BEDROCK, out, "PartiallyCompleted", [1, 2, 3])
    assert set(got) == {1, 2}  # a record that never came back is the caller's "no result" failure
    ok = orjson.loads(got[1].body or b"")
    assert got[1].kind == "succeeded" and ok["object"] == "chat.completion" and ok["model"] == "gw-claude"
    assert ok["choices"][0]["message"]["content"] == "yes" and got[1].usage is not None
    assert (got[1].usage.input_tokens, got[1].usage.output_tokens) == (9, 4)
    assert got[2].kind == "failed" and got[2].status == 400
    assert orjson.loads(got[2].body or b"")["error"]["message"] == "Malformed input request"
    same = native.bedrock_results("anthropic", BEDROCK, out, "Completed", [1])
    assert orjson.loads(same[1].body or b"")["model"] == "gw-claude"


def test_a_stopped_job_leaves_its_unrun_lines_cancelled() -> None:
    got = native.bedrock_results("openai", BEDROCK, b"", "Stopped", [1, 2])
    assert [got[i].kind for i in (1, 2)] == ["cancelled", "cancelled"]
    assert native.ended("bedrock", {"status": "Stopped"}) and not native.ended("bedrock", {"status": "InProgress"})


def test_the_job_request_names_the_bucket_and_the_role() -> None:
    dep = _dep(prefix="mb/")
    job = bedrock_jobs.job_request(dep, "batch_abc")
    assert job["jobName"] == "batch-abc" and job["modelId"] == BEDROCK.upstream_model
    assert job["roleArn"] == "arn:aws:iam::123456789012:role/batch" and job["clientRequestToken"] == "batch_abc"
    assert job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"] == "s3://my-batches/mb/batch_abc/input.jsonl"
    assert job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"] == "s3://my-batches/mb/batch_abc/output/"
    arn = "arn:aws:bedrock:eu-west-1:123456789012:model-invocation-job/abcdef123456"
    assert bedrock_jobs.output_key(dep, job, arn) == "mb/batch_abc/output/abcdef123456/input.jsonl.out"
    # An output prefix the gateway did not write is never read.
    elsewhere = {"outputDataConfig": {"s3OutputDataConfig": {"s3Uri": "s3://other-bucket/x/"}}}
    assert bedrock_jobs.output_key(dep, elsewhere, arn) is None
    assert bedrock_jobs.control_endpoint(dep) == "https://bedrock.eu-west-1.amazonaws.com"
    assert bedrock_jobs.s3_endpoint(dep) == "https://s3.eu-west-1.amazonaws.com"


def test_a_native_bedrock_batch_needs_a_bucket_and_a_role() -> None:
    with pytest.raises(ValidationError, match="bucket"):
        Deployment.model_validate({
            "cluster": "c", "protocol": "bedrock", "endpoints": ["127.0.0.1:1"], "bedrock": {"region": "us-east-1"},
            "batch": {"mode": "native"}})
    with pytest.raises(ValidationError, match="native batches run on"):
        Deployment.model_validate({"cluster": "c", "protocol": "gemini", "endpoints": ["127.0.0.1:1"],
                                   "batch": {"mode": "native"}})
