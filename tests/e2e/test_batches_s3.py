"""Files and batch outputs in an S3-compatible bucket, through a real Envoy with the openai SDK:
the extproc stores uploads and the batch's output file in moto's S3 server (tests/moto_s3.py, each
request's SigV4 signature checked), reads them back for `files.content`, and another tenant gets 404.
One stack for the module."""

from __future__ import annotations

import io
import json
import os
import time

import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.moto_s3 import moto_s3
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

OTHER_KEY = "sk-modelyard-demo-l2"  # tenant demo-l2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("batches-s3")
    with moto_s3() as s3:
        creds = workdir / "s3-credentials"  # a mounted secret's shape: read when used, never logged
        creds.write_text(f"[default]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n")
        data, _ = demo_config_free_ports()
        data["models"] = [m for m in data["models"] if m["name"] == "demo-gpt"]
        for m in data["models"]:
            m["deployments"] = m["deployments"][:1]
            for d in m["deployments"]:
                d.pop("warmup", None)
                d.pop("watermark", None)
        data.pop("ratelimit", None)
        data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite")}
        data["extproc"]["batches"] = {
            "sqlite_path": str(workdir / "batches.sqlite"), "finalize_every_s": 0.2,
            "file_store": {"kind": "s3", "endpoint": s3.endpoint, "bucket": s3.bucket, "prefix": "files/",
                           "credentials_file": str(creds)}}
        for name, value in UPSTREAM_KEYS.items():
            os.environ.setdefault(name, value)
        with start_stack(workdir, data, shared_demos=True) as s:
            yield s, s3


def test_uploads_and_batch_outputs_round_trip_through_the_bucket(stack) -> None:
    s, s3 = stack
    oai = openai.OpenAI(base_url=f"{s.url}/v1", api_key=DEMO_KEY, max_retries=0)
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "demo-gpt", "messages": [{"role": "user", "content": f"s3 line {i}"}],
                                  "max_tokens": 16}}) for i in range(3)]
    body = ("\n".join(lines) + "\n").encode()
    f = oai.files.create(file=("input.jsonl", io.BytesIO(body)), purpose="batch")
    assert oai.files.content(f.id).content == body
    assert any(k.startswith("files/") and k.endswith("/" + f.id) for k in s3.object_keys())

    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 60
    while (batch := oai.batches.retrieve(batch.id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)
    assert batch.status == "completed" and batch.output_file_id
    out = [json.loads(x) for x in oai.files.content(batch.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in out) == ["r0", "r1", "r2"]
    assert all(r["response"]["status_code"] == 200 for r in out)
    assert any(k.endswith("/" + batch.output_file_id) for k in s3.object_keys())  # the output lives in the bucket too
    stored = s3.client().get_object(Bucket=s3.bucket, Key=next(k for k in s3.object_keys()
                                                                 if k.endswith("/" + batch.output_file_id)))
    assert stored["Body"].read() == oai.files.content(batch.output_file_id).content

    other = openai.OpenAI(base_url=f"{s.url}/v1", api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError):
        other.files.content(f.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(batch.output_file_id)

    assert oai.files.delete(f.id).deleted
    assert not any(k.endswith("/" + f.id) for k in s3.object_keys())
