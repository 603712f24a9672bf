"""Files and batches through a real Envoy with the real SDKs (docs/batches.md): OpenAI's
`files.create` + `batches.create` polled to `completed` with output and error files as OpenAI
documents them (a line on a Claude deployment, translated; a malformed line in the error file),
each line metered as its own call at the batch price; Anthropic's `messages.batches`; another
tenant gets 404; a batch survives the extproc's SIGKILL mid-run. One stack for the module.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import time

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

OTHER_KEY = "sk-modelyard-demo-l2"  # tenant demo-l2
LEASE_S = 1.5
MAX_FILE = 4 * 1024 * 1024  # the upload bound, small enough to cross in a test


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("batches")
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"] if m["name"] in ("demo-gpt", "demo-claude", "demo-embed")]
    for m in data["models"]:
        for d in m["deployments"]:
            d.pop("warmup", None)
            d.pop("watermark", None)
    data.pop("ratelimit", None)
    # One line at a time: the restart test needs lines still queued behind a running one.
    data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite"), "lease_s": LEASE_S, "concurrency": 1}
    data["extproc"]["batches"] = {"sqlite_path": str(workdir / "batches.sqlite"), "finalize_every_s": 0.2,
                                  "max_file_bytes": MAX_FILE}
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with start_stack(workdir, data, shared_demos=True) as s:
        yield s


def _oai(stack, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


def _line(custom_id: str, model: str, text: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 32}})


def _until_done(client: openai.OpenAI, batch_id: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "cancelled", "expired"):
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} not done after {timeout}s: {b}")


def _jsonl(raw: bytes) -> list[dict]:
    return [json.loads(x) for x in raw.decode().splitlines() if x.strip()]


def test_openai_batch_runs_each_line_and_writes_output_and_error_files(stack) -> None:
    oai = _oai(stack)
    body = "\n".join([_line("gpt-1", "demo-gpt", "batch hello gpt"), "{not json",
                      _line("claude-1", "demo-claude", "batch hello claude"),
                      _line("nobody-1", "no-such-model", "who")]) + "\n"
    f = oai.files.create(file=("input.jsonl", io.BytesIO(body.encode())), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(body.encode()) and f.filename == "input.jsonl"
    assert oai.files.retrieve(f.id).id == f.id
    assert f.id in [x.id for x in oai.files.list(purpose="batch")]
    assert oai.files.content(f.id).content == body.encode()

    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                               metadata={"job": "nightly"})
    assert batch.object == "batch" and batch.status in ("in_progress", "completed") and batch.input_file_id == f.id
    assert batch.request_counts is not None and batch.request_counts.total == 4
    done = _until_done(oai, batch.id)
    assert done.status == "completed" and done.completed_at is not None and done.metadata == {"job": "nightly"}
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 2, 2)
    assert done.output_file_id and done.error_file_id

    out = {row["custom_id"]: row for row in _jsonl(oai.files.content(done.output_file_id).content)}
    assert set(out) == {"gpt-1", "claude-1"}
    for cid, text in (("gpt-1", "batch hello gpt"), ("claude-1", "batch hello claude")):
        row = out[cid]
        assert set(row) == {"id", "custom_id", "response", "error"} and row["error"] is None
        assert row["response"]["status_code"] == 200 and row["response"]["request_id"]
        completion = ChatCompletion.model_validate(row["response"]["body"])  # the SDK's own type
        assert completion.choices[0].message.content.endswith(f"echo: {text}")
    # The Claude line ran on the Anthropic deployment, translated: the OpenAI shape came back.
    assert out["claude-1"]["response"]["body"]["model"] == "demo-claude"

    errors = {row["error"]["line"] if row["error"] else row["custom_id"]: row
              for row in _jsonl(oai.files.content(done.error_file_id).content)}
    assert errors[2]["custom_id"] is None and errors[2]["response"] is None
    assert errors[2]["error"]["code"] == "invalid_json_line"
    unknown = errors["nobody-1"]  # it ran, and got the gateway's 404 in OpenAI's error shape
    assert unknown["response"]["status_code"] == 404 and unknown["error"] is None
    assert unknown["response"]["body"]["error"]["message"]

    # Each line metered as its own call, at the batch price (batch_discount: 0.5).
    rows: list = []
    deadline = time.monotonic() + 10
    while len(rows) < 2 and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            rows = db.execute("SELECT task_id, model, status, input_tokens, output_tokens, cost FROM requests "
                              "WHERE task_id LIKE ? AND status = 200 ORDER BY model", (batch.id + "-%",)).fetchall()
        time.sleep(0.1)
    assert [r[1] for r in rows] == ["demo-claude", "demo-gpt"]
    prices = {"demo-gpt": (2.5, 10.0), "demo-claude": (3.0, 15.0)}
    for _, model, _, tin, tout, cost in rows:
        i, o = prices[model]
        assert cost == pytest.approx((tin * i + tout * o) / 1000 * 0.5)

    assert any(b.id == batch.id for b in oai.batches.list())
    assert oai.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        oai.files.retrieve(f.id)


def test_a_large_file_round_trips_and_the_bound_is_413(stack) -> None:
    oai = _oai(stack)
    blob = os.urandom(3 * 1024 * 1024)
    f = oai.files.create(file=("blob.bin", io.BytesIO(blob)), purpose="user_data")
    assert f.bytes == len(blob) and oai.files.content(f.id).content == blob
    oai.files.delete(f.id)
    with pytest.raises(openai.APIStatusError) as e:
        oai.files.create(file=("big.bin", io.BytesIO(bytes(MAX_FILE + 1))), purpose="user_data")
    assert e.value.status_code == 413 and f"keeps files up to {MAX_FILE} bytes" in e.value.message


def test_bad_batch_requests_get_openai_errors(stack) -> None:
    oai = _oai(stack)
    with pytest.raises(openai.NotFoundError):
        oai.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    f = oai.files.create(file=("x.jsonl", io.BytesIO(b"\n\n")), purpose="batch")
    with pytest.raises(openai.BadRequestError) as e:
        oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "no requests" in e.value.message
    with pytest.raises(openai.BadRequestError):
        oai.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        oai.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="nonsense")  # type: ignore[arg-type]


def test_another_tenant_gets_404_for_files_and_batches(stack) -> None:
    mine = _oai(stack)
    f = mine.files.create(file=("in.jsonl", io.BytesIO((_line("a", "demo-gpt", "mine") + "\n").encode())),
                          purpose="batch")
    batch = mine.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    theirs = _oai(stack, OTHER_KEY)
    for call in (lambda: theirs.files.retrieve(f.id), lambda: theirs.files.content(f.id),
                 lambda: theirs.files.delete(f.id), lambda: theirs.batches.retrieve(batch.id),
                 lambda: theirs.batches.cancel(batch.id),
                 lambda: theirs.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert f.id not in [x.id for x in theirs.files.list()]
    assert batch.id not in [b.id for b in theirs.batches.list()]
    done = _until_done(mine, batch.id)
    assert done.status == "completed"
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(done.output_file_id or "")


def test_anthropic_message_batches(stack) -> None:
    client = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    batch = client.messages.batches.create(requests=[
        {"custom_id": "c-1", "params": {"model": "demo-claude", "max_tokens": 32,
                                         "messages": [{"role": "user", "content": "claude batch one"}]}},
        {"custom_id": "g-1", "params": {"model": "demo-gpt", "max_tokens": 32,
                                         "messages": [{"role": "user", "content": "gpt under messages"}]}},
        {"custom_id": "x-1", "params": {"model": "no-such-model", "max_tokens": 32,
                                         "messages": [{"role": "user", "content": "nobody"}]}},
    ])
    assert batch.type == "message_batch" and batch.processing_status in ("in_progress", "ended")
    deadline = time.monotonic() + 60
    while batch.processing_status != "ended" and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.messages.batches.retrieve(batch.id)
    assert batch.processing_status == "ended" and batch.ended_at is not None and batch.results_url
    counts = batch.request_counts
    assert (counts.succeeded, counts.errored, counts.processing, counts.canceled) == (2, 1, 0, 0)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert results["c-1"].type == "succeeded" and results["g-1"].type == "succeeded"
    assert results["c-1"].message.content[0].text.endswith("echo: claude batch one")  # type: ignore[union-attr]
    assert results["g-1"].message.content[0].text.endswith("echo: gpt under messages")  # type: ignore[union-attr]
    assert results["x-1"].type == "errored" and results["x-1"].error.error.type == "not_found_error"  # type: ignore[union-attr]
    assert batch.id in [b.id for b in client.messages.batches.list()]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.create(requests=[])
    other = anthropic.Anthropic(base_url=stack.url, api_key=OTHER_KEY, max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.retrieve(batch.id)
    with pytest.raises(anthropic.NotFoundError):
        other.messages.batches.delete(batch.id)
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_an_embeddings_batch(stack) -> None:
    oai = _oai(stack)
    line = json.dumps({"custom_id": "e-1", "method": "POST", "url": "/v1/embeddings",
                       "body": {"model": "demo-embed", "input": ["one", "two"]}})
    f = oai.files.create(file=("emb.jsonl", io.BytesIO((line + "\n").encode())), purpose="batch")
    done = _until_done(oai, oai.batches.create(input_file_id=f.id, endpoint="/v1/embeddings",
                                               completion_window="24h").id)
    assert done.status == "completed" and done.error_file_id is None
    (row,) = _jsonl(oai.files.content(done.output_file_id or "").content)
    assert row["custom_id"] == "e-1" and len(row["response"]["body"]["data"]) == 2


def test_cancel_a_batch(stack) -> None:
    oai = _oai(stack)
    lines = [_line(f"slow-{i}", "demo-claude", f"cancel me {i} demo-slow") for i in range(3)]
    f = oai.files.create(file=("slow.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch")
    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelled = oai.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled") and cancelled.cancelling_at is not None
    done = _until_done(oai, batch.id, timeout=30)
    assert done.status == "cancelled" and done.request_counts is not None and done.request_counts.failed >= 2
    errs = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert {e["error"]["code"] for e in errs if e["error"]} == {"batch_cancelled"}


# ---------------------------------------------------------------- last: it kills the extproc
def test_a_batch_survives_the_extproc_killed_mid_run(stack) -> None:
    oai = _oai(stack)
    lines = [_line("slow", "demo-claude", "survive a crash demo-slow"),
             _line("after-1", "demo-gpt", "queued through a crash"), _line("after-2", "demo-claude", "me too")]
    f = oai.files.create(file=("crash.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch")
    batch = oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    slow = f"{batch.id}-1"  # the first line's task (the task API shows a tenant its batch lines too)
    deadline = time.monotonic() + 20
    while httpx.get(f"{stack.url}/v1/tasks/{slow}", headers={"authorization": f"Bearer {DEMO_KEY}"},
                    timeout=5).json()["status"] != "running":
        assert time.monotonic() < deadline, "the slow line never started"
        time.sleep(0.05)
    time.sleep(0.5)  # its replay has reached the slow upstream; the others wait behind it (concurrency 1)
    extproc = stack.child("extproc")
    os.kill(extproc.proc.pid, signal.SIGKILL)
    extproc.proc.wait(10)
    stack.restart("extproc")
    done = _until_done(oai, batch.id, timeout=60)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    out = {r["custom_id"]: r for r in _jsonl(oai.files.content(done.output_file_id or "").content)}
    assert out["slow"]["response"]["body"]["choices"][0]["message"]["content"].endswith("survive a crash demo-slow")
    assert out["after-1"]["response"]["body"]["choices"][0]["message"]["content"].endswith("queued through a crash")
    # The interrupted line ran once more, marked; the queued ones ran once, after the restart.
    task = httpx.get(f"{stack.url}/v1/tasks/{slow}", headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=5).json()
    assert (task["attempts"], task["retried"]) == (2, True)
    after = httpx.get(f"{stack.url}/v1/tasks/{batch.id}-2", headers={"authorization": f"Bearer {DEMO_KEY}"},
                      timeout=5).json()
    assert (after["attempts"], after["retried"]) == (1, False)
