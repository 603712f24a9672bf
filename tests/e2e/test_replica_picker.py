"""The replica picker through a real Envoy: two demo replicas report vLLM metrics; the call lands
on the replica the picker chose (the replica says so in `x-demo-replica`), stale readings fall
back to Envoy's own balancer, and prefix affinity holds a conversation on one replica (until that
replica is past the load bound)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import yaml

from extproc.replicas.explain import add_replica_picks
from tests.stack_config import free_port, small_config, start_stack

KEY = "sk-modelyard-demo"
SYSTEM = "You are the demo assistant of the replica tests. " * 12  # several prompt blocks


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, list[str]]]:
    ports = [free_port(), free_port()]
    eps = [f"127.0.0.1:{p}" for p in ports]
    data = small_config()
    data["models"] = [{"name": "rp", "task_types": ["chat"], "deployments": [{
        "cluster": "demo-rp", "protocol": "openai", "endpoints": eps,
        "replica_metrics": {"kind": "vllm", "interval_ms": 50, "stale_after_ms": 400,
                            # long enough that no slow moment here outlasts it (the last test)
                            "failure_hold_ms": 600_000}}]}]
    data["extproc"]["audit_db"] = "audit.sqlite"
    with start_stack(tmp_path_factory.mktemp("rp"), data) as stack:
        yield stack, eps


def _fake(ep: str, **body: Any) -> None:
    httpx.post(f"http://{ep}/fake-queue", json=body, timeout=5).raise_for_status()


def _chat(client: openai.OpenAI, messages: list[dict[str, str]]) -> str:
    raw = client.chat.completions.with_raw_response.create(model="rp", messages=messages)  # type: ignore[arg-type]
    return raw.headers["x-demo-replica"]


def _settle(stack: Any, client: openai.OpenAI, expect: str, limit_s: float = 10.0) -> None:
    """The picker reads the replicas every 50 ms: calls until the first one lands as expected
    (the readings after `_fake` take one poll to arrive), then the test counts from there."""
    deadline = time.monotonic() + limit_s
    while _chat(client, [{"role": "user", "content": "settle"}]) != expect:
        assert time.monotonic() < deadline, f"never landed on {expect}"


def _read(stack: Any, ep: str, waiting: int, limit_s: float = 10.0) -> None:
    """Until the extproc's picker reads `waiting` for `ep` (its modelyard_replica_state): a call that lands
    where expected does not prove it (the old reading may pick the same replica)."""
    line = f'endpoint="{ep}",field="waiting"}} {float(waiting)}'
    deadline = time.monotonic() + limit_s
    while line not in httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text:
        assert time.monotonic() < deadline, f"the picker never read waiting={waiting} for {ep}"
        time.sleep(0.05)


def test_every_call_goes_to_the_replica_with_the_short_queue(replicas: tuple[Any, list[str]]) -> None:
    stack, (a, b) = replicas
    _fake(a, waiting=50, metrics=True)
    _fake(b, waiting=0, metrics=True)
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _settle(stack, client, b)
    landed = Counter(_chat(client, [{"role": "user", "content": f"q{i}"}]) for i in range(30))
    assert landed == {b: 30}
    _fake(a, waiting=0)
    _fake(b, waiting=50)
    _settle(stack, client, a)
    landed = Counter(_chat(client, [{"role": "user", "content": f"r{i}"}]) for i in range(30))
    assert landed == {a: 30}


def test_stale_readings_fall_back_to_envoys_balancer(replicas: tuple[Any, list[str]]) -> None:
    stack, (a, b) = replicas
    _fake(a, waiting=50, metrics=False)  # /metrics answers 503: both readings go stale
    _fake(b, waiting=0, metrics=False)
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    before = _picks(stack)
    deadline = time.monotonic() + 10
    while _picks(stack) == before or _picks(stack)[""] == before[""]:  # until the picker stops picking
        _chat(client, [{"role": "user", "content": "stale?"}])
        assert time.monotonic() < deadline
    landed = Counter(_chat(client, [{"role": "user", "content": f"s{i}"}]) for i in range(40))
    assert set(landed) == {a, b}, landed  # round robin: both get calls, the deep queue unseen
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=0, metrics=True)


def test_prefix_affinity_holds_a_conversation_on_one_replica(replicas: tuple[Any, list[str]]) -> None:
    stack, (a, b) = replicas
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=2, metrics=True)
    _settle(stack, client, a)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}]
    assert _chat(client, messages) == a  # the shorter queue, and now its prefix is on a
    # b becomes the shorter queue: a new prompt goes there, the conversation stays where its prefix is.
    _fake(a, waiting=2)
    _fake(b, waiting=0)
    _settle(stack, client, b)
    for turn in range(5):
        messages += [{"role": "assistant", "content": f"answer {turn}"},
                     {"role": "user", "content": f"and then {turn}?"}]
        assert _chat(client, messages) == a, turn
    other = [{"role": "system", "content": "Another conversation entirely. " * 20},
             {"role": "user", "content": "hi"}]
    assert _chat(client, other) == b
    _fake(b, waiting=0)
    _fake(a, waiting=0)


def test_a_conversation_spills_off_a_replica_past_the_load_bound(replicas: tuple[Any, list[str]]) -> None:
    """Saturation: the prefix holds a conversation on a while a is within 1.25x the mean queue (the
    old placement held it there however deep), and moves it to b once a is past that bound."""
    stack, (a, b) = replicas
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=2, metrics=True)
    _settle(stack, client, a)
    messages = [{"role": "system", "content": "A hot system prompt of the spill test. " * 20},
                {"role": "user", "content": "hello"}]
    assert _chat(client, messages) == a
    _fake(a, waiting=60)  # 61 <= ceil(1.25 * 101 / 2): within the bound, the prefix holds
    _fake(b, waiting=40)
    _read(stack, a, 60)
    _read(stack, b, 40)
    messages += [{"role": "assistant", "content": "answer"}, {"role": "user", "content": "more?"}]
    assert _chat(client, messages) == a
    _fake(a, waiting=80)  # 81 > ceil(1.25 * 121 / 2): past it, the conversation spills to b
    _read(stack, a, 80)  # a call landing on b proves nothing: at 60 against 40 it lands there too
    for turn in range(3):
        messages += [{"role": "assistant", "content": f"answer {turn}"},
                     {"role": "user", "content": f"and then {turn}?"}]
        assert _chat(client, messages) == b, turn
    _fake(a, waiting=0)
    _fake(b, waiting=0)


def _audit_detail(stack: Any, task_id: str) -> dict[str, Any]:
    """The call's audit row's detail, once the writer thread has it in SQLite."""
    deadline = time.monotonic() + 20
    while True:
        conn = sqlite3.connect(stack.cfg.extproc.audit_db)
        try:
            row = conn.execute("SELECT detail FROM audit WHERE task_id = ? AND event = 'call'", (task_id,)).fetchone()
        finally:
            conn.close()
        if row is not None:
            return json.loads(row[0])
        assert time.monotonic() < deadline, f"no audit row for {task_id}"
        time.sleep(0.1)


def test_the_audit_row_names_the_replica_that_answered_and_why(replicas: tuple[Any, list[str]]) -> None:
    stack, (a, b) = replicas
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _fake(a, waiting=40, metrics=True)
    _fake(b, waiting=0, metrics=True)
    _settle(stack, client, b)
    raw = client.chat.completions.with_raw_response.create(model="rp", messages=[{"role": "user", "content": "who?"}])
    detail = _audit_detail(stack, raw.headers["x-modelyard-task-id"])
    assert detail["replica"] == raw.headers["x-demo-replica"] == b
    assert detail["reason"] == "queue" and "answered" not in detail, detail
    # What `route explain --live` replays: the board's state at the extproc's /metrics.
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    doc: dict[str, Any] = {"rows": [{"rank": 1, "model": "rp", "cluster": "demo-rp"}]}
    add_replica_picks(stack.cfg, doc, metrics, time.monotonic())
    pick = doc["rows"][0]["replicas"]
    assert (pick["endpoint"], pick["why"]) == (b, "queue")
    assert {r["endpoint"]: r["waiting"] for r in pick["ranked"]} == {a: 40, b: 0}
    # Readings stale: Envoy balanced, and the row says so and who answered.
    _fake(a, metrics=False)
    _fake(b, metrics=False)
    deadline = time.monotonic() + 10
    while True:
        raw = client.chat.completions.with_raw_response.create(model="rp", messages=[{"role": "user", "content": "?"}])
        detail = _audit_detail(stack, raw.headers["x-modelyard-task-id"])
        if detail["replica"] is None:
            break
        assert time.monotonic() < deadline, detail
    assert detail == {"replica": None, "reason": "stale", "fallback": "envoy",
                      "answered": raw.headers["x-demo-replica"]}
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=0, metrics=True)


def test_new_weights_take_effect_on_sighup_without_a_restart(replicas: tuple[Any, list[str]]) -> None:
    stack, (a, b) = replicas
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _fake(a, waiting=0, kv=0.9, metrics=True)  # a: the empty queue, b: the empty KV cache
    _fake(b, waiting=8, kv=0.0, metrics=True)
    _settle(stack, client, a)  # the default weights: the queue decides
    pid = stack.child("extproc").proc.pid
    cfg = yaml.safe_load(stack.config_path.read_text())
    cfg["models"][0]["deployments"][0]["replica_metrics"]["weights"] = {"queue": 0.1, "kv_cache": 1.0}
    stack.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    os.kill(pid, signal.SIGHUP)
    _settle(stack, client, b)  # the KV headroom decides now
    landed = Counter(_chat(client, [{"role": "user", "content": f"w{i}"}]) for i in range(10))
    assert landed == {b: 10}
    assert stack.child("extproc").proc.pid == pid  # no restart
    _fake(a, waiting=0, kv=0.0)
    _fake(b, waiting=0, kv=0.0)


def test_a_replica_that_failed_is_not_picked_again_at_once(replicas: tuple[Any, list[str]]) -> None:
    """Last in this module: `a` stays held (failure_hold_ms) for the rest of the stack's life."""
    stack, (a, b) = replicas
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY, max_retries=0)
    _fake(a, waiting=0, metrics=True)
    _fake(b, waiting=20, metrics=True)
    _settle(stack, client, a)
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                   json={"model": "rp", "messages": [{"role": "user", "content": "demo-fail-500"}]}, timeout=30)
    # Envoy's retry may carry it to b; either way the pick, a, failed.
    assert r.status_code == 502 or r.headers.get("x-demo-replica") == b, (r.status_code, r.headers)
    landed = Counter(_chat(client, [{"role": "user", "content": f"after {i}"}]) for i in range(10))
    assert landed == {b: 10}  # a still has the shorter queue, but it failed its last call


def _picks(stack: Any) -> Counter[str]:
    """modelyard_replica_picks_total by endpoint, from the extproc's /metrics."""
    out: Counter[str] = Counter()
    text = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
    for line in text.splitlines():
        if line.startswith("modelyard_replica_picks_total{"):
            ep = line.split('endpoint="', 1)[1].split('"', 1)[0]
            out[ep] += int(float(line.rsplit(" ", 1)[1]))
    return out
