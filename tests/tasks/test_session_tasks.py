"""The session's task decisions, driven with plain ext_proc messages (no Envoy, no worker):
202 after validation/routing/admission, the replay marker, the /v1/tasks answers."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import yaml

from contracts.config import parse_config
from extproc.context import Interim
from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from extproc.tasks.board import TaskBoard
from extproc.tasks.marker import MARKER_HEADER
from tests.core.session_driver import body_msg, headers_msg, set_headers
from tests.stack_config import free_port, without_watermarks

ROOT = Path(__file__).resolve().parents[2]
ROUTES = build_routes()
KEY = "sk-modelyard-demo"
OTHER = "sk-modelyard-demo-l2"
CHAT = orjson.dumps({"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
async def gateway(tmp_path: Path):
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"]["tasks"] = {"sqlite_path": str(tmp_path / "tasks.sqlite")}
    config = parse_config(data)
    gw = Gateway.build(config, tasks=TaskBoard.from_config(config))  # the worker is not started
    yield gw
    await gw.close()


async def _run(gw: Gateway, headers: dict[str, str], body: bytes | None = None):
    s = Session(gw, ROUTES)
    try:
        r = await s.handle(headers_msg(headers, eos=body is None))
        if body is not None and r.WhichOneof("response") == "request_headers":
            r = await s.handle(body_msg(body))
        return r
    finally:
        s.close()


def _chat_headers(**extra: str) -> dict[str, str]:
    return {":method": "POST", ":path": "/v1/chat/completions", "content-type": "application/json", **extra}


async def test_prefer_async_answers_202_and_stores_no_key(gateway: Gateway) -> None:
    r = await _run(gateway, _chat_headers(authorization=f"Bearer {KEY}", prefer="respond-async"), CHAT)
    imm = r.immediate_response
    assert imm.status.code == 202
    doc = orjson.loads(imm.body)
    headers = set_headers(imm.headers)
    assert headers["location"] == f"/v1/tasks/{doc['id']}" and headers["x-modelyard-task-id"] == doc["id"]
    assert doc["status"] == "queued" and doc["object"] == "task"
    assert gateway.tasks is not None
    rec = await gateway.tasks.store.get(doc["id"], with_body=True)
    assert rec is not None and rec.tenant == "demo" and rec.request.body == CHAT
    assert rec.request.path == "/v1/chat/completions"
    assert not any(k in ("authorization", "prefer") for k, _ in rec.request.headers)


async def test_without_the_preference_the_request_goes_upstream(gateway: Gateway) -> None:
    r = await _run(gateway, _chat_headers(authorization=f"Bearer {KEY}"), CHAT)
    assert r.WhichOneof("response") == "request_body"


async def test_a_valid_marker_runs_the_task_as_its_tenant(gateway: Gateway) -> None:
    assert gateway.tasks is not None
    marker = gateway.tasks.marker.sign("a" * 32, "demo")
    s = Session(gateway, ROUTES)
    try:
        r = await s.handle(headers_msg(_chat_headers(**{MARKER_HEADER: marker, "prefer": "respond-async"})))
        assert MARKER_HEADER in r.request_headers.response.header_mutation.remove_headers  # never upstream
        r = await s.handle(body_msg(CHAT))
        assert r.WhichOneof("response") == "request_body"  # a replay is never deferred again
        assert set_headers(r.request_body.response.header_mutation)["x-modelyard-task-id"] == "a" * 32
    finally:
        s.close()


async def test_a_forged_marker_authenticates_nothing(gateway: Gateway) -> None:
    forged = "v1:" + "a" * 32 + ":demo:" + "0" * 64
    r = await _run(gateway, _chat_headers(**{MARKER_HEADER: forged}), CHAT)
    assert r.immediate_response.status.code == 401


async def test_polls_take_any_protocols_header_and_hide_other_tenants_tasks(gateway: Gateway) -> None:
    r = await _run(gateway, _chat_headers(authorization=f"Bearer {KEY}", prefer="respond-async"), CHAT)
    task_id = orjson.loads(r.immediate_response.body)["id"]
    get = {":method": "GET", ":path": f"/v1/tasks/{task_id}"}
    for auth in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"x-goog-api-key": KEY}):
        r = await _run(gateway, {**get, **auth})
        assert r.immediate_response.status.code == 200
        assert orjson.loads(r.immediate_response.body)["status"] == "queued"
    theirs = await _run(gateway, {**get, "authorization": f"Bearer {OTHER}"})
    unknown = await _run(gateway, {**get, ":path": "/v1/tasks/nope", "authorization": f"Bearer {OTHER}"})
    assert theirs.immediate_response.status.code == unknown.immediate_response.status.code == 404
    r = await _run(gateway, {**get, ":method": "DELETE", "x-api-key": KEY})
    assert orjson.loads(r.immediate_response.body)["status"] == "cancelled"


async def test_a_store_that_is_down_refuses_with_503_in_the_callers_shape(tmp_path: Path) -> None:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"]["tasks"] = {"store": "redis", "redis_url": f"redis://127.0.0.1:{free_port()}/0"}
    config = parse_config(data)
    gw = Gateway.build(config, tasks=TaskBoard.from_config(config))
    try:
        headers = {":method": "POST", ":path": "/v1/messages", "content-type": "application/json",
                   "x-api-key": KEY, "anthropic-version": "2023-06-01", "prefer": "respond-async"}
        body = orjson.dumps({"model": "demo-claude", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]})
        r = await _run(gw, headers, body)
        assert r.immediate_response.status.code == 503
        err = orjson.loads(r.immediate_response.body)
        assert err["type"] == "error" and err["error"]["type"] == "overloaded_error"
        assert "retry-after" in set_headers(r.immediate_response.headers)
        r = await _run(gw, {":method": "GET", ":path": "/v1/tasks/abc", "x-api-key": KEY})
        assert r.immediate_response.status.code == 503
    finally:
        await gw.close()


async def test_a_long_poll_asks_envoy_for_its_wait_then_answers(gateway: Gateway) -> None:
    r = await _run(gateway, _chat_headers(authorization=f"Bearer {KEY}", prefer="respond-async"), CHAT)
    task_id = orjson.loads(r.immediate_response.body)["id"]
    s = Session(gateway, ROUTES)
    try:
        step = await s.handle(headers_msg({":method": "GET", ":path": f"/v1/tasks/{task_id}?wait=1",
                                           "x-api-key": KEY}, eos=True))
        assert isinstance(step, Interim)  # first: more time for this message, not an answer
        assert step.message.WhichOneof("response") is None
        assert step.message.override_message_timeout.ToMilliseconds() == 3000  # the wait + 2 s
        t0 = time.monotonic()
        final = await step.then()
        assert not isinstance(final, Interim) and time.monotonic() - t0 >= 0.9
        assert final.immediate_response.status.code == 200
        assert orjson.loads(final.immediate_response.body)["status"] == "queued"
    finally:
        s.close()
    # An unknown id is a 404 at once, before any extension.
    r = await _run(gateway, {":method": "GET", ":path": "/v1/tasks/nope?wait=30", "x-api-key": KEY})
    assert r.immediate_response.status.code == 404


async def test_accepting_tasks_takes_no_slot_of_a_limited_deployment(tmp_path: Path) -> None:
    """A deployment with max_inflight: 1 accepts any number of tasks (the 202 waits on no slot and
    keeps none); its one slot stays free for the next synchronous call."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["extproc"]["tasks"] = {"sqlite_path": str(tmp_path / "tasks.sqlite")}
    gpt = next(m for m in data["models"] if m["name"] == "demo-gpt")
    for d in gpt["deployments"]:
        d.update(max_inflight=1, queue={"max_wait_s": 1})
    config = parse_config(data)
    gw = Gateway.build(config, tasks=TaskBoard.from_config(config))
    try:
        for _ in range(3):
            r = await _run(gw, _chat_headers(authorization=f"Bearer {KEY}", prefer="respond-async"), CHAT)
            assert r.immediate_response.status.code == 202
        assert all(q.inflight == 0 and q.waiting() == 0 for q in gw.dispatcher.limits.queues.values())
        s = Session(gw, ROUTES)
        await s.handle(headers_msg(_chat_headers(authorization=f"Bearer {KEY}")))
        r = await s.handle(body_msg(CHAT))
        assert r.WhichOneof("response") == "request_body"  # sent upstream at once: the slot was free
        s.close()
    finally:
        await gw.close()
