"""Async tasks through a real Envoy: `Prefer: respond-async` -> 202, poll and long-poll, tenant
isolation, cancel, a signed webhook, and extproc restarts (SIGKILL and SIGTERM) with a queued and a
running task: nothing lost, nothing run twice except the one marked retry.

Every task's work is the worker's replay through Envoy, so the upstream /stats counters say how
many times a task really ran.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import signal
import sqlite3
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from controlplane.environments import CompressionSettings, EnvironmentConfig
from devstack.demo.behaviour import demo_embedding
from tests.conftest import DEMO_KEY, UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, free_port, start_stack
from tests.vision.formgen import build_form
from tests.vision.imagegen import encode

pytestmark = pytest.mark.e2e

OTHER_KEY = "sk-modelyard-demo-l2"  # tenant demo-l2: no webhook secret
SECRET_ENV = "MODELYARD_TEST_TASK_WEBHOOK_SECRET"
SECRET = "whsec-test-7f3a9c"
ASYNC = {"prefer": "respond-async"}
BEARER = {"authorization": f"Bearer {DEMO_KEY}"}
LEASE_S = 3.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("tasks")
    data, _ = demo_config_free_ports()
    # One task at a time: a slow one keeps the next one queued, which the restart tests need.
    data["extproc"]["tasks"] = {"sqlite_path": str(workdir / "tasks.sqlite"), "lease_s": LEASE_S, "concurrency": 1}
    data["tenants"][0]["webhook_secret_env"] = SECRET_ENV
    for m in data["models"]:  # the upstreams' request counters count task runs only: no warm-up pings
        for d in m["deployments"]:
            d.pop("warmup", None)
    os.environ[SECRET_ENV] = SECRET
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    # Answers compressed as the shipped environments do (envoy/environments/*.yaml), for every size:
    # the SDKs' default Accept-Encoding must not reach the stored result.
    env = EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1,
                            compression=CompressionSettings(response_encodings=["gzip", "br"], min_response_bytes=0))
    with start_stack(workdir, data, env, shared_demos=True) as s:
        s.data = data  # type: ignore[attr-defined]
        yield s


def _upstream_requests(stack, model: str) -> int:
    ep = next(m for m in stack.data["models"] if m["name"] == model)["deployments"][0]["endpoints"][0]
    return httpx.get(f"http://{ep}/stats", timeout=5).json()["requests"]


def _get(stack, task_id: str, headers: dict[str, str], wait: float | None = None) -> httpx.Response:
    q = f"?wait={wait}" if wait is not None else ""
    return httpx.get(f"{stack.url}/v1/tasks/{task_id}{q}", headers=headers, timeout=30)


def _until_final(stack, task_id: str, headers: dict[str, str] = BEARER, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = _get(stack, task_id, headers, wait=5)
        assert r.status_code == 200, r.text
        doc = r.json()
        if doc["status"] in ("succeeded", "failed", "cancelled"):
            return doc
    raise AssertionError(f"task {task_id} not finished after {timeout}s: {doc}")


def _until_status(stack, task_id: str, status: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = _get(stack, task_id, BEARER).json()
        if doc["status"] == status:
            return doc
        time.sleep(0.1)
    raise AssertionError(f"task {task_id} never {status}: {doc}")


def _submit_claude(stack, text: str, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/messages", timeout=30,
                      headers={"x-api-key": DEMO_KEY, "anthropic-version": "2023-06-01", **ASYNC, **(headers or {})},
                      json={"model": "demo-claude", "max_tokens": 64, "messages": [{"role": "user", "content": text}]})


# ---------------------------------------------------------------- each protocol, end to end


def test_openai_chat_async(stack) -> None:
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    messages = [{"role": "user", "content": "async hello openai"}]
    raw = oai.chat.completions.with_raw_response.create(model="demo-gpt", messages=messages, extra_headers=ASYNC)
    assert raw.http_response.status_code == 202, raw.http_response.text
    accepted = raw.http_response.json()
    assert accepted["object"] == "task" and accepted["status"] in ("queued", "running")
    assert raw.headers["location"] == f"/v1/tasks/{accepted['id']}"
    assert raw.headers["x-modelyard-task-id"] == accepted["id"]
    assert abs(accepted["created_at"] - time.time()) < 30

    done = _until_final(stack, accepted["id"])
    assert done["status"] == "succeeded" and done["error"] is None, done
    assert done["completed_at"] >= done["created_at"] and done["attempts"] == 1 and not done["retried"]
    result = ChatCompletion.model_validate(done["result"])  # exactly what the SDK reads synchronously
    sync = oai.chat.completions.create(model="demo-gpt", messages=messages)
    assert result.choices[0].message.content == sync.choices[0].message.content
    assert result.choices[0].message.content.endswith("echo: async hello openai")
    assert result.model == "demo-gpt" and result.usage is not None and result.usage.completion_tokens > 0
    # Metered once, by its replay (under the task's id), with the upstream's usage; the 202 is not.
    rows: list = []
    deadline = time.monotonic() + 10
    while not rows and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            rows = db.execute("SELECT tenant, model, status, output_tokens FROM requests WHERE task_id = ?",
                              (accepted["id"],)).fetchall()
        time.sleep(0.1)
    assert rows == [("demo", "demo-gpt", 200, result.usage.completion_tokens)]


def test_polled_results_are_readable_with_the_sdks_default_headers(stack) -> None:
    """The openai SDK submits (its httpx asks gzip, deflate, br), httpx with its own defaults polls:
    the result is the synchronous answer as JSON, the poll itself comes compressed, and a poller
    asking identity reads the very same document."""
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    messages = [{"role": "user", "content": "readable by default"}]
    raw = oai.with_options(default_headers=ASYNC).chat.completions.with_raw_response.create(
        model="demo-gpt", messages=messages)
    assert raw.http_response.status_code == 202, raw.http_response.text
    assert "gzip" in raw.http_response.request.headers["accept-encoding"]
    task_id = raw.http_response.json()["id"]
    with httpx.Client(headers=BEARER, timeout=30) as poller:  # httpx's default Accept-Encoding
        waited = poller.get(f"{stack.url}/v1/tasks/{task_id}?wait=10")
        while waited.json()["status"] in ("queued", "running"):
            waited = poller.get(f"{stack.url}/v1/tasks/{task_id}?wait=10")
        polled = poller.get(f"{stack.url}/v1/tasks/{task_id}")
    for r in (waited, polled):
        assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"  # Envoy's compressor
        doc = r.json()
        assert doc["status"] == "succeeded" and "result_base64" not in doc and "result_headers" not in doc, doc
    sync = oai.chat.completions.create(model="demo-gpt", messages=messages)
    assert ChatCompletion.model_validate(doc["result"]).choices[0].message.content == \
        sync.choices[0].message.content == "[demo-openai] echo: readable by default"
    plain = httpx.get(f"{stack.url}/v1/tasks/{task_id}", headers={**BEARER, "accept-encoding": "identity"},
                      timeout=30)
    assert "content-encoding" not in plain.headers and plain.json() == doc
    # The stored answer is the identity one: /result serves the same JSON, compressed only for its poller.
    result = httpx.get(f"{stack.url}/v1/tasks/{task_id}/result", headers=BEARER, timeout=30)
    assert result.headers["content-encoding"] == "gzip" and result.json() == doc["result"]


def test_anthropic_messages_async(stack) -> None:
    claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    messages = [{"role": "user", "content": "async hello anthropic"}]
    raw = claude.messages.with_raw_response.create(model="demo-claude", max_tokens=64, messages=messages,
                                                   extra_headers=ASYNC)
    assert raw.http_response.status_code == 202, raw.http_response.text
    task_id = raw.http_response.json()["id"]
    # The poll authenticates with the same key in the caller's own header (x-api-key).
    done = _until_final(stack, task_id, headers={"x-api-key": DEMO_KEY})
    assert done["status"] == "succeeded", done
    result = Message.model_validate(done["result"])
    assert result.content[0].text == "[demo-anthropic] echo: async hello anthropic"
    assert result.model == "demo-claude" and result.usage.output_tokens > 0


def test_gemini_generate_content_async(stack) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "async hello gemini"}]}]}
    # The key in the query string: it must not be stored with the task (the replay carries a marker).
    r = httpx.post(f"{stack.url}/v1beta/models/demo-gemini:generateContent?key={DEMO_KEY}", json=body,
                   headers=ASYNC, timeout=30)
    assert r.status_code == 202, r.text
    done = _until_final(stack, r.json()["id"], headers={"x-goog-api-key": DEMO_KEY})
    assert done["status"] == "succeeded", done
    parts = done["result"]["candidates"][0]["content"]["parts"]
    assert parts[0]["text"] == "[demo-gemini] echo: async hello gemini"
    stored = Path(stack.data["extproc"]["tasks"]["sqlite_path"]).read_bytes()
    assert DEMO_KEY.encode() not in stored and DEMO_KEY.encode().hex().encode() not in stored


def test_kserve_v2_infer_async(stack) -> None:
    x = np.zeros((2, 3, 32, 32), np.float32)
    x[0, 0] = 2.0  # red-ish, then an all-zero image
    body = {"id": "async-7", "inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                         "data": x.ravel().tolist()}]}
    url = f"{stack.url}/v2/models/demo-colors/infer"
    r = httpx.post(url, json=body, headers={**BEARER, **ASYNC}, timeout=30)
    assert r.status_code == 202, r.text
    done = _until_final(stack, r.json()["id"])
    assert done["status"] == "succeeded", done
    sync = httpx.post(url, json=body, headers=BEARER, timeout=30)
    assert sync.status_code == 200
    assert done["result"] == sync.json()
    assert done["result"]["model_name"] == "demo-colors" and done["result"]["id"] == "async-7"


def test_kserve_v2_binary_outputs_async_keep_every_byte(stack) -> None:
    """A polled binary answer is the synchronous one: same bytes, same header length."""
    x = np.zeros((1, 3, 32, 32), np.float32)
    x[0, 2] = 1.0
    body = {"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}],
            "parameters": {"binary_data_output": True}}
    url = f"{stack.url}/v2/models/demo-colors/infer"
    sync = httpx.post(url, json=body, headers=BEARER, timeout=30)
    assert sync.status_code == 200 and "inference-header-content-length" in sync.headers, sync.headers
    r = httpx.post(url, json=body, headers={**BEARER, **ASYNC}, timeout=30)
    assert r.status_code == 202, r.text
    done = _until_final(stack, r.json()["id"])
    assert done["status"] == "succeeded" and done["result"] is None, done
    assert base64.b64decode(done["result_base64"]) == sync.content
    assert done["result_headers"]["inference-header-content-length"] == sync.headers["inference-header-content-length"]
    raw = httpx.get(f"{stack.url}{done['result_url']}", headers=BEARER, timeout=10)
    assert raw.status_code == 200 and raw.content == sync.content
    assert raw.headers["inference-header-content-length"] == sync.headers["inference-header-content-length"]
    assert raw.headers["content-type"] == sync.headers["content-type"]
    other = httpx.get(f"{stack.url}{done['result_url']}", headers={"authorization": f"Bearer {OTHER_KEY}"},
                      timeout=10)
    assert other.status_code == 404  # another tenant's result, as an unknown id


def test_image_classify_async(stack) -> None:
    fields = [("model", "demo-colors", None, None), ("top_k", "2", None, None),
              ("image", encode((0, 0, 255), (20, 12), "PNG"), "blue.png", "image/png"),
              ("image", encode((255, 255, 0), (9, 9), "JPEG"), "yellow.jpg", "image/jpeg")]
    body, ctype = build_form(fields)
    r = httpx.post(f"{stack.url}/v1/images/classify", content=body, timeout=30,
                   headers={**BEARER, **ASYNC, "content-type": ctype})
    assert r.status_code == 202, r.text
    done = _until_final(stack, r.json()["id"])
    assert done["status"] == "succeeded", done
    rows = done["result"]["results"]
    assert [row["filename"] for row in rows] == ["blue.png", "yellow.jpg"]
    assert [row["labels"][0]["label"] for row in rows] == ["blue", "yellow"]


def test_upstream_failure_is_a_failed_task_with_the_callers_error(stack) -> None:
    r = _submit_claude(stack, "please demo-fail-500")
    assert r.status_code == 202
    done = _until_final(stack, r.json()["id"])
    assert done["status"] == "failed" and done["result"] is None
    assert done["error"]["status"] == 502
    assert done["error"]["body"]["type"] == "error"  # Anthropic's error shape, as a synchronous call gets
    assert done["error"]["body"]["error"]["type"] == "api_error"


# ---------------------------------------------------------------- refused at acceptance


def test_async_refusals_are_synchronous(stack) -> None:
    # Validation, routing and auth happen before the 202: their errors come back at once.
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={**BEARER, **ASYNC}, timeout=30,
                   json={"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404, r.text
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": "Bearer wrong", **ASYNC},
                   timeout=30, json={"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 401
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={**BEARER, **ASYNC}, timeout=30,
                   json={"model": "demo-gpt", "stream": True, "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and "respond-async" in r.json()["error"]["message"]


def test_rate_limits_count_the_acceptance_not_the_replay(stack) -> None:
    # demo-limited: 3 requests at once, then 1 per second. Three tasks take the burst; the fourth
    # is refused at once; the three replays are not counted again, so all three run.
    limited = {"authorization": "Bearer sk-modelyard-demo-limited", **ASYNC}
    body = {"model": "demo-gpt", "messages": [{"role": "user", "content": "limited"}]}
    statuses, ids = [], []
    for _ in range(4):
        r = httpx.post(f"{stack.url}/v1/chat/completions", headers=limited, json=body, timeout=30)
        statuses.append(r.status_code)
        if r.status_code == 202:
            ids.append(r.json()["id"])
    assert statuses == [202, 202, 202, 429], statuses
    for task_id in ids:
        doc = _until_final(stack, task_id, headers={"authorization": "Bearer sk-modelyard-demo-limited"})
        assert doc["status"] == "succeeded", doc


def test_forged_replay_marker_is_ignored(stack) -> None:
    forged = {"x-modelyard-task-replay": "v1:" + "ab" * 16 + ":demo:" + "00" * 32}
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers=forged, timeout=30,
                   json={"model": "demo-gpt", "messages": [{"role": "user", "content": "sneak"}]})
    assert r.status_code == 401  # no key: the marker did not authenticate anything
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={**BEARER, **forged}, timeout=30,
                   json={"model": "demo-gpt", "messages": [{"role": "user", "content": "sneak"}]})
    assert r.status_code == 200


# ---------------------------------------------------------------- polls


def test_long_poll_returns_when_the_task_ends(stack) -> None:
    r = _submit_claude(stack, "take your time demo-slow")
    task_id = r.json()["id"]
    first = _get(stack, task_id, BEARER).json()
    assert first["status"] in ("queued", "running") and first["result"] is None
    t0 = time.monotonic()
    waited = _get(stack, task_id, BEARER, wait=30).json()
    took = time.monotonic() - t0
    assert waited["status"] == "succeeded", waited
    assert took < 15  # the slow upstream takes 5 s; the one long poll answered when it ended
    assert waited["result"]["content"][0]["text"].endswith("take your time demo-slow")


def test_wait_is_capped_and_validated(stack) -> None:
    r = _submit_claude(stack, "cap demo-slow")
    task_id = r.json()["id"]
    assert _get(stack, task_id, BEARER, wait=-1).status_code == 400
    t0 = time.monotonic()
    doc = _get(stack, task_id, BEARER, wait=2).json()
    assert 1.5 < time.monotonic() - t0 < 8 and doc["status"] in ("queued", "running")
    _until_final(stack, task_id)


def test_a_long_poll_outlasts_envoys_message_timeout(stack) -> None:
    # Three slow tasks, one at a time: the last one ends ~15 s from now. A 12 s poll waits past
    # Envoy's 10 s ext_proc message timeout (the extproc extends it) and answers 200, still open.
    ids = [_submit_claude(stack, f"one after another {i} demo-slow").json()["id"] for i in range(3)]
    t0 = time.monotonic()
    r = _get(stack, ids[-1], BEARER, wait=12)
    took = time.monotonic() - t0
    assert r.status_code == 200, r.text
    assert r.json()["status"] in ("queued", "running") and 11.5 < took < 14, (r.json(), took)
    for task_id in ids:
        assert _until_final(stack, task_id)["status"] == "succeeded"


def test_other_tenants_get_404_like_an_unknown_id(stack) -> None:
    r = _submit_claude(stack, "mine only")
    task_id = r.json()["id"]
    other = {"authorization": f"Bearer {OTHER_KEY}"}
    theirs = _get(stack, task_id, other)
    unknown = _get(stack, "0" * 32, other)
    assert theirs.status_code == unknown.status_code == 404
    assert theirs.json()["error"]["type"] == unknown.json()["error"]["type"]
    assert httpx.delete(f"{stack.url}/v1/tasks/{task_id}", headers=other, timeout=10).status_code == 404
    assert _get(stack, task_id, {}).status_code == 401
    assert _until_final(stack, task_id)["status"] == "succeeded"  # the owner's task went on


# ---------------------------------------------------------------- cancel


def test_cancel_a_running_and_a_queued_task(stack) -> None:
    before = _upstream_requests(stack, "demo-claude")
    running = _submit_claude(stack, "cancel me while running demo-slow").json()["id"]
    _until_status(stack, running, "running")
    queued = _submit_claude(stack, "cancel me while queued").json()["id"]  # concurrency 1: waits
    assert _get(stack, queued, BEARER).json()["status"] == "queued"
    r = httpx.delete(f"{stack.url}/v1/tasks/{queued}", headers=BEARER, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = httpx.delete(f"{stack.url}/v1/tasks/{running}", headers=BEARER, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    time.sleep(6)  # longer than the slow upstream: a finished replay must not overwrite the cancel
    for task_id in (running, queued):
        doc = _get(stack, task_id, BEARER).json()
        assert doc["status"] == "cancelled" and doc["result"] is None, doc
    assert _upstream_requests(stack, "demo-claude") - before == 1  # the queued one never ran


# ---------------------------------------------------------------- webhook


class _Receiver(BaseHTTPRequestHandler):
    got: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).got.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_webhook_is_signed_with_the_tenants_secret(stack) -> None:
    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Receiver.got.clear()
    try:
        url = f"http://127.0.0.1:{port}/hook"
        r = _submit_claude(stack, "call me back", {"x-modelyard-callback-url": url})
        assert r.status_code == 202, r.text
        task_id = r.json()["id"]
        done = _until_final(stack, task_id)
        deadline = time.monotonic() + 15
        while not _Receiver.got and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_Receiver.got) == 1
        headers, body = _Receiver.got[0]
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-modelyard-signature"], expected)
        assert headers["x-modelyard-task-id"] == task_id
        payload = json.loads(body)
        assert payload["id"] == task_id and payload["status"] == "succeeded"
        assert payload["result"] == done["result"]
        assert payload["result"]["content"][0]["text"] == "[demo-anthropic] echo: call me back"  # readable
        assert SECRET not in body.decode()
        # A tenant without a signing secret cannot ask for a webhook: refused before acceptance.
        r = httpx.post(f"{stack.url}/v1/chat/completions", timeout=30,
                       headers={"authorization": f"Bearer {OTHER_KEY}", "x-modelyard-callback-url": url, **ASYNC},
                       json={"model": "demo-gpt", "messages": [{"role": "user", "content": "x"}]})
        assert r.status_code == 400
    finally:
        server.shutdown()


# ---------------------------------------------------------------- restarts (last: they restart the extproc)


def test_a_webhook_nobody_took_is_sent_after_a_restart(stack) -> None:
    port = free_port()  # nothing listens there yet: every try fails
    url = f"http://127.0.0.1:{port}/late"
    task_id = _submit_claude(stack, "call me when you can", {"x-modelyard-callback-url": url}).json()["id"]
    assert _until_final(stack, task_id)["status"] == "succeeded"
    time.sleep(4.5)  # the three tries (0.5 s, 1 s, 2 s apart) are over
    _Receiver.got.clear()
    server = ThreadingHTTPServer(("127.0.0.1", port), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stack.restart("extproc")  # the new process finds the webhook still owed
        deadline = time.monotonic() + 20
        while not _Receiver.got and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(_Receiver.got) == 1
        headers, body = _Receiver.got[0]
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert hmac.compare_digest(headers["x-modelyard-signature"], expected)
        assert json.loads(body)["id"] == task_id
        time.sleep(1.0)
        assert len(_Receiver.got) == 1  # taken once: not sent again
    finally:
        server.shutdown()


def test_extproc_killed_with_a_running_and_a_queued_task(stack) -> None:
    before = _upstream_requests(stack, "demo-claude")
    running = _submit_claude(stack, "survive a crash demo-slow").json()["id"]
    _until_status(stack, running, "running")
    queued = _submit_claude(stack, "queued through a crash").json()["id"]
    time.sleep(1.0)  # the running replay has reached the slow upstream
    assert _get(stack, queued, BEARER).json()["status"] == "queued"
    extproc = stack.child("extproc")
    os.kill(extproc.proc.pid, signal.SIGKILL)
    extproc.proc.wait(10)
    stack.restart("extproc")

    q = _until_final(stack, queued)
    assert q["status"] == "succeeded" and q["attempts"] == 1 and not q["retried"], q
    assert q["result"]["content"][0]["text"] == "[demo-anthropic] echo: queued through a crash"
    r = _until_final(stack, running)
    assert r["status"] == "succeeded" and r["attempts"] == 2 and r["retried"], r  # the one marked retry
    assert r["result"]["content"][0]["text"].endswith("survive a crash demo-slow")
    # The running task reached the upstream twice (first run and the retry), the queued one once.
    assert _upstream_requests(stack, "demo-claude") - before == 3


def test_sigterm_drains_a_running_task_and_keeps_a_queued_one(stack) -> None:
    before = _upstream_requests(stack, "demo-claude")
    running = _submit_claude(stack, "finish while draining demo-slow").json()["id"]
    _until_status(stack, running, "running")
    queued = _submit_claude(stack, "queued over a restart").json()["id"]
    stack.restart("extproc")  # SIGTERM: the drain lets the running replay finish; no new claims

    r = _until_final(stack, running)
    assert r["status"] == "succeeded" and r["attempts"] == 1 and not r["retried"], r
    q = _until_final(stack, queued)
    assert q["status"] == "succeeded" and q["attempts"] == 1 and not q["retried"], q
    assert _upstream_requests(stack, "demo-claude") - before == 2


def test_responses_api_async(stack) -> None:
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    raw = oai.responses.with_raw_response.create(model="demo-claude", input="async hello responses",
                                                 extra_headers=ASYNC)
    assert raw.http_response.status_code == 202, raw.http_response.text
    done = _until_final(stack, raw.http_response.json()["id"])
    assert done["status"] == "succeeded", done
    result = Response.model_validate(done["result"])
    assert result.output_text == "[demo-anthropic] echo: async hello responses" and result.usage.output_tokens > 0


def test_embeddings_async(stack) -> None:
    oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    raw = oai.embeddings.with_raw_response.create(model="demo-embed-gemini", input=["async", "embed"],
                                                  encoding_format="float", extra_headers=ASYNC)
    assert raw.http_response.status_code == 202, raw.http_response.text
    done = _until_final(stack, raw.http_response.json()["id"])
    assert done["status"] == "succeeded", done
    got = np.array([d["embedding"] for d in done["result"]["data"]], np.float32)
    assert np.array_equal(got, np.array([demo_embedding("async"), demo_embedding("embed")], np.float32))
