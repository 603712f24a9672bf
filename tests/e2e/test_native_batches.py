"""Batches passed through to the provider's own batch API (docs/batches.md "Native batches"),
through a real Envoy with the openai and anthropic SDKs, against the demo providers' Files +
Batches and Message Batches (devstack/demo/batch_api.py): the gateway uploads and creates the
batch there, polls it in the background, and brings its results back as its own files under its
own ids; each line metered at the batch price; translated where the caller's protocol is not the
provider's; another tenant gets 404; a batch survives the extproc killed mid-poll; a cancel reaches
the provider. One stack for the module."""

from __future__ import annotations

import os
import signal
import time

import anthropic
import openai
import pytest

from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.e2e.batch_calls import chat_line as _line
from tests.e2e.batch_calls import demo_batch_seconds
from tests.e2e.batch_calls import jsonl as _jsonl
from tests.e2e.batch_calls import metered as _metered
from tests.e2e.batch_calls import openai_batch as _openai_batch
from tests.e2e.batch_calls import until_done as _until_done
from tests.stack_config import demo_config_free_ports, start_stack

pytestmark = pytest.mark.e2e

OTHER_KEY = "sk-modelyard-demo-l2"  # tenant demo-l2
BATCH_SECONDS = "1.5"  # the demo providers end a batch this long after it was created


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("native-batches")
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"] if m["name"] in ("demo-gpt-batch", "demo-claude-batch")]
    data.pop("ratelimit", None)
    data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite")}
    data["extproc"]["batches"] = {"sqlite_path": str(workdir / "batches.sqlite"), "finalize_every_s": 0.2}
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with demo_batch_seconds(BATCH_SECONDS), start_stack(workdir, data, shared_demos=True) as s:
        yield s


def _oai(stack, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


def test_an_openai_batch_runs_at_the_providers_batch_api(stack) -> None:
    oai = _oai(stack)
    batch = _openai_batch(oai, [_line("a", "demo-gpt-batch", "native one"), "{oops",
                                _line("b", "demo-gpt-batch", "native two")])
    assert batch.id.startswith("batch_") and "demo" not in batch.id  # the gateway's id, not the provider's
    assert batch.status == "in_progress" and batch.request_counts is not None and batch.request_counts.total == 3
    done = _until_done(oai, batch.id)
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
    out = {r["custom_id"]: r for r in _jsonl(oai.files.content(done.output_file_id or "").content)}
    assert set(out) == {"a", "b"}
    body = out["a"]["response"]["body"]
    assert body["model"] == "demo-gpt-batch" and body["choices"][0]["message"]["content"].endswith("native one")
    assert "-batch-" in body["id"]  # answered by the provider's batch API, not its synchronous endpoint
    assert out["a"]["id"] == f"batch_req_{batch.id}-1" and out["a"]["response"]["request_id"] == f"{batch.id}-1"
    errors = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert [e["error"]["code"] for e in errors] == ["invalid_json_line"]
    rows = _metered(stack, batch.id, 2)
    assert [(r[1], r[2], r[6]) for r in rows] == [("demo-gpt-batch", 200, "native-batch")] * 2
    for _, _, _, tin, tout, cost, _ in rows:  # at the batch price: half of 2.5 / 10.0 per 1k
        assert tin > 0 and cost == pytest.approx((tin * 2.5 + tout * 10.0) / 1000 * 0.5)
    other = _oai(stack, OTHER_KEY)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(done.output_file_id or "")


def test_each_api_runs_translated_at_the_other_providers_batch_api(stack) -> None:
    # An OpenAI batch on the Anthropic deployment's Message Batches ...
    oai = _oai(stack)
    batch = _openai_batch(oai, [_line("c1", "demo-claude-batch", "to anthropic")])
    done = _until_done(oai, batch.id)
    (row,) = _jsonl(oai.files.content(done.output_file_id or "").content)
    completion = row["response"]["body"]
    assert completion["object"] == "chat.completion" and completion["model"] == "demo-claude-batch"
    assert completion["choices"][0]["message"]["content"].endswith("to anthropic")
    # ... and an Anthropic message batch on the OpenAI deployment's Files + Batches.
    anth = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    mb = anth.messages.batches.create(requests=[{"custom_id": "m1", "params": {
        "model": "demo-gpt-batch", "max_tokens": 32, "messages": [{"role": "user", "content": "to openai"}]}}])
    assert mb.id.startswith("msgbatch_") and mb.processing_status == "in_progress"
    deadline = time.monotonic() + 60
    while (mb := anth.messages.batches.retrieve(mb.id)).processing_status != "ended":
        assert time.monotonic() < deadline, mb
        time.sleep(0.2)
    assert mb.request_counts.succeeded == 1
    (result,) = list(anth.messages.batches.results(mb.id))
    assert result.custom_id == "m1" and result.result.type == "succeeded"
    message = result.result.message  # type: ignore[union-attr]
    assert message.model == "demo-gpt-batch" and message.content[0].text.endswith("to openai")  # type: ignore[union-attr]


def test_a_native_batch_survives_the_extproc_killed_mid_poll(stack) -> None:
    oai = _oai(stack)
    # demo-hold-3000: the provider's batch still runs while the extproc is down and restarts
    batch = _openai_batch(oai, [_line("k1", "demo-gpt-batch", "through a crash demo-hold-3000")])
    extproc = stack.child("extproc")
    os.kill(extproc.proc.pid, signal.SIGKILL)  # the provider's batch is still running
    extproc.proc.wait(10)
    stack.restart("extproc")
    done = _until_done(oai, batch.id)
    assert done.status == "completed"
    (row,) = _jsonl(oai.files.content(done.output_file_id or "").content)
    assert row["response"]["body"]["choices"][0]["message"]["content"].endswith("through a crash demo-hold-3000")
    assert len(_metered(stack, batch.id, 1)) == 1  # metered once, by the finalizer that closed it


def test_a_cancel_reaches_the_provider(stack) -> None:
    oai = _oai(stack)
    # demo-hold-10000: the provider's batch stays open until the cancel reaches it, however busy the box
    batch = _openai_batch(oai, [_line("x1", "demo-gpt-batch", "never demo-hold-10000"),
                                _line("x2", "demo-gpt-batch", "nor me")])
    assert oai.batches.cancel(batch.id).status == "cancelling"
    done = _until_done(oai, batch.id)
    assert done.status == "cancelled" and done.request_counts is not None and done.request_counts.completed == 0
    errors = _jsonl(oai.files.content(done.error_file_id or "").content)
    assert sorted(e["custom_id"] for e in errors) == ["x1", "x2"]
    assert all(e["error"]["code"] == "batch_cancelled" for e in errors)
