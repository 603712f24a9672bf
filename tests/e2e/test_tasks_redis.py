"""Two extproc replicas behind one Envoy sharing their tasks in a real Redis: a task accepted by
either replica is polled through either, replayed by whichever worker claims it (its marker checked
by whichever replica Envoy picks, with the shared key), and runs exactly once."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from controlplane.environments import CompressionSettings, EnvironmentConfig
from tests.conftest import DEMO_KEY
from tests.ratelimit.redis_server import REDIS_BIN, RedisServer
from tests.stack_config import add_extproc_replica, small_config, start_stack

pytestmark = pytest.mark.e2e
SECRET_ENV = "MODELYARD_TEST_TASK_MARKER_KEY"
# Answers compressed as the shipped environments do: the SDKs' default Accept-Encoding must not reach
# the stored result.
COMPRESSED = CompressionSettings(response_encodings=["gzip"], min_response_bytes=0)


def _runner(stack, task_id: str, timeout: float = 20.0):
    """The replica whose worker took the task (its log says so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in stack.children:
            if child.name.startswith("extproc"):
                log = child.log_path(stack.log_dir).read_text(errors="replace")
                if f"task {task_id}: running" in log:
                    return child
        time.sleep(0.1)
    raise AssertionError(f"no replica ran task {task_id}")


def _upstream_requests(data: dict) -> int:
    ep = data["models"][0]["deployments"][0]["endpoints"][0]
    return httpx.get(f"http://{ep}/stats", timeout=5).json()["requests"]


def test_replicas_share_tasks_in_redis(tmp_path: Path) -> None:
    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    redis_srv = RedisServer()
    redis_srv.start()
    os.environ[SECRET_ENV] = "shared-marker-key-for-the-test"
    try:
        data = small_config()
        for d in data["models"][0]["deployments"]:  # the upstream's request counter counts task runs only
            d.pop("warmup", None)
        data["extproc"]["tasks"] = {"store": "redis", "redis_url": redis_srv.url, "secret_env": SECRET_ENV,
                                    "concurrency": 2, "lease_s": 3}
        stack = start_stack(tmp_path, data, EnvironmentConfig(name="t", admin=None, concurrency=1,
                                                              compression=COMPRESSED))
        second, _ = add_extproc_replica(stack, data, tmp_path)
        stack.env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                                      extproc_endpoints=[data["extproc"]["address"], second], compression=COMPRESSED)
        with stack:
            before = _upstream_requests(data)
            oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
            ids = []
            for i in range(8):
                raw = oai.chat.completions.with_raw_response.create(
                    model="demo-gpt", messages=[{"role": "user", "content": f"shared task {i}"}],
                    extra_headers={"prefer": "respond-async"})
                assert raw.http_response.status_code == 202, raw.http_response.text
                ids.append(raw.http_response.json()["id"])
            deadline = time.monotonic() + 60
            done: dict[str, dict] = {}
            while len(done) < len(ids) and time.monotonic() < deadline:
                for task_id in ids:
                    if task_id in done:
                        continue
                    r = httpx.get(f"{stack.url}/v1/tasks/{task_id}?wait=2",
                                  headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30)
                    assert r.status_code == 200, r.text  # whichever replica answers knows the task
                    assert r.headers["content-encoding"] == "gzip"  # the poll is compressed, not the result
                    if r.json()["status"] in ("succeeded", "failed", "cancelled"):
                        done[task_id] = r.json()
            assert len(done) == len(ids)
            for i, task_id in enumerate(ids):
                doc = done[task_id]
                assert doc["status"] == "succeeded" and doc["attempts"] == 1 and "result_base64" not in doc, doc
                assert doc["result"]["choices"][0]["message"]["content"] == f"[demo-openai] echo: shared task {i}"
            assert _upstream_requests(data) - before == len(ids)  # each ran exactly once

            # The replica running a task dies: the other takes it over once its lease runs out.
            before = _upstream_requests(data)
            raw = oai.chat.completions.with_raw_response.create(
                model="demo-gpt", messages=[{"role": "user", "content": "outlive a replica demo-slow"}],
                extra_headers={"prefer": "respond-async"})
            task_id = raw.http_response.json()["id"]
            runner = _runner(stack, task_id)
            time.sleep(1.0)  # the replay has reached the slow upstream
            runner.proc.send_signal(signal.SIGKILL)
            runner.proc.wait(10)
            deadline = time.monotonic() + 60
            doc: dict = {}
            while time.monotonic() < deadline:
                r = httpx.get(f"{stack.url}/v1/tasks/{task_id}?wait=10",
                              headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30)
                if r.status_code != 200:  # Envoy has not noticed the dead replica yet: its own 5xx
                    time.sleep(0.2)
                    continue
                doc = r.json()
                if doc["status"] not in ("queued", "running"):
                    break
            assert doc["status"] == "succeeded" and doc["attempts"] == 2 and doc["retried"], doc
            assert doc["result"]["choices"][0]["message"]["content"].endswith("outlive a replica demo-slow")
            survivor = next(c for c in stack.children if c.name.startswith("extproc") and c is not runner)
            assert f"task {task_id}: its run was interrupted" in survivor.log_path(stack.log_dir).read_text()
            assert _upstream_requests(data) - before == 2  # the first run and the marked retry
    finally:
        redis_srv.stop()
