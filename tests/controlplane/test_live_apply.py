"""The control plane's apply path and its HTTP API (a real aiohttp server), with a minimal extproc
subscriber speaking contracts/live_config.py. No Envoy is connected here (tests/e2e/test_live_config.py
has one): with none, Envoy's side is settled at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from contracts.errors import ConfigError
from contracts.live_config import ACK_PATH, APPLY_PATH, CONFIG_PATH, STATUS_PATH, TEXT_PATH, config_version
from controlplane.environments import EnvironmentConfig
from controlplane.live.applier import LiveConfig
from controlplane.live.http_api import build_app
from controlplane.live.subscribers import Subscribers
from controlplane.live.validation import candidate, restart_only
from tests.stack_config import small_config

ENV = EnvironmentConfig(name="test", admin=None)


def text_of(data: dict[str, Any]) -> bytes:
    return yaml.safe_dump(data, sort_keys=False).encode()


@pytest.fixture
def base() -> dict[str, Any]:
    return small_config()


def with_model(data: dict[str, Any], name: str = "demo-new", port: int = 8999) -> dict[str, Any]:
    model = {**data["models"][0], "name": name, "deployments": [
        {"cluster": "demo-new", "protocol": "openai", "endpoints": [f"127.0.0.1:{port}"]}]}
    return {**data, "models": [*data["models"], model]}


@pytest.fixture
async def client(base: dict[str, Any]) -> AsyncIterator[TestClient]:
    live = LiveConfig(ENV, candidate(text_of(base), ENV, None), timeout_s=2.0)
    async with TestClient(TestServer(build_app(live))) as c:
        yield c


def live_of(client: TestClient) -> LiveConfig:
    from controlplane.live.http_api import LIVE

    return client.server.app[LIVE]


async def subscriber(client: TestClient, worker: str, have: str, *, ok: bool = True, polls: int = 2) -> list[str]:
    """A minimal extproc: long-poll, 'apply', ack; returns the versions it was handed."""
    got = []
    for _ in range(polls):
        r = await client.get(CONFIG_PATH, params={"have": have, "worker": worker, "wait": "5"})
        if r.status == 304:
            continue
        assert r.status == 200
        body = await r.json()
        assert config_version(body["yaml"].encode()) == body["version"]
        got.append(body["version"])
        ack = await client.post(ACK_PATH, json={"worker": worker, "version": body["version"], "ok": ok,
                                                "error": "" if ok else "queue bound below in-flight"})
        assert ack.status == 200
        if ok:
            have = body["version"]
        else:
            break
    return got


def test_restart_only_settings(base: dict[str, Any]) -> None:
    old = candidate(text_of(base), ENV, None).cfg
    moved = {**base, "extproc": {**base["extproc"], "address": "127.0.0.1:1"}}
    assert restart_only(old, candidate(text_of(moved), ENV, None).cfg) == ["extproc.address"]
    with pytest.raises(ConfigError, match="extproc.address cannot change"):
        candidate(text_of(moved), ENV, old)
    assert restart_only(old, candidate(text_of(with_model(base)), ENV, None).cfg) == []
    served = {**base, "extproc": {**base["extproc"], "unix_socket_server": "grpcio"}}
    assert restart_only(old, candidate(text_of(served), ENV, None).cfg) == ["extproc.unix_socket_server"]


async def test_a_file_that_does_not_validate_changes_nothing(client: TestClient, base: dict[str, Any]) -> None:
    live = live_of(client)
    before = live.running.version
    for bad, why in ((b"models: [", "not valid YAML"), (text_of({**base, "models": []}), "models"),
                     (text_of({**base, "listener": {"address": "127.0.0.1", "port": 1}}), "listener cannot change")):
        r = await client.post(APPLY_PATH, data=bad)
        assert r.status == 400
        assert why in (await r.json())["error"]
    assert live.running.version == before
    assert live.counts.applies == {"invalid": 3}


async def test_apply_waits_for_every_subscribed_worker(client: TestClient, base: dict[str, Any]) -> None:
    live = live_of(client)
    v0 = live.running.version
    workers = [asyncio.create_task(subscriber(client, f"w{i}", v0)) for i in range(2)]
    await asyncio.sleep(0.3)  # both are polling
    assert {w["worker"] for w in (await (await client.get(STATUS_PATH)).json())["workers"]} == {"w0", "w1"}
    new = text_of(with_model(base))
    r = await client.post(APPLY_PATH, data=new)
    assert r.status == 200, await r.text()
    assert (await r.json())["version"] == config_version(new)
    assert [await w for w in workers] == [[config_version(new)]] * 2
    st = await (await client.get(STATUS_PATH)).json()
    assert st["version"] == config_version(new)
    assert {w["version"] for w in st["workers"]} == {config_version(new)}
    metrics = await (await client.get("/metrics")).text()
    assert f'modelyard_config_info{{version="{config_version(new)}"}} 1.0' in metrics
    # The same file again: already everywhere, nothing is pushed.
    again = await client.post(APPLY_PATH, data=new)
    assert again.status == 200 and (await again.json())["unchanged"] is True


async def test_a_worker_that_refuses_fails_the_apply(client: TestClient, base: dict[str, Any]) -> None:
    v0 = live_of(client).running.version
    worker = asyncio.create_task(subscriber(client, "w0", v0, ok=False))
    await asyncio.sleep(0.2)
    r = await client.post(APPLY_PATH, data=text_of(with_model(base)))
    assert r.status == 422
    assert "w0: queue bound below in-flight" in (await r.json())["error"]
    await worker
    # It is not offered the version it refused again (that would loop): its poll waits.
    poll = await client.get(CONFIG_PATH, params={"have": v0, "worker": "w0", "wait": "0.2"})
    assert poll.status == 304


async def test_a_silent_worker_times_the_apply_out(client: TestClient, base: dict[str, Any]) -> None:
    v0 = live_of(client).running.version
    r = await client.get(CONFIG_PATH, params={"have": v0, "worker": "mute", "wait": "0.1"})
    assert r.status == 304
    r = await client.post(APPLY_PATH, data=text_of(with_model(base)))
    assert r.status == 504
    assert "mute" in (await r.json())["error"]


async def test_bad_long_poll_and_ack_requests(client: TestClient) -> None:
    assert (await client.get(CONFIG_PATH, params={"have": "x"})).status == 400
    assert (await client.post(ACK_PATH, data=b"nope")).status == 400
    assert (await client.post(ACK_PATH, json={"worker": "w"})).status == 400
    assert (await client.post(APPLY_PATH, data=b"")).status == 400
    # A worker on another version is answered at once.
    r = await client.get(CONFIG_PATH, params={"have": "old", "worker": "w9"})
    assert r.status == 200 and (await r.json())["version"] == live_of(client).running.version


def test_a_worker_not_heard_from_leaves_the_set() -> None:
    now = [0.0]
    subs = Subscribers(clock=lambda: now[0], stale_after_s=50)
    subs.polled("a", "v1")
    subs.poll_ended("a")
    subs.polled("b", "v1")  # still polling: live however long ago
    now[0] = 60
    assert [w.id for w in subs.live()] == ["b"]
    assert subs.progress("v2").missing == ("b",)
    subs.acked("b", "v2", ok=True)
    assert subs.progress("v2").done


async def test_apply_needs_the_token_when_one_is_set(client: TestClient, base: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from controlplane.live.wire import APPLIED_BY_HEADER, TOKEN_ENV

    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    new = text_of(with_model(base))
    assert (await client.post(APPLY_PATH, data=new)).status == 401
    assert (await client.post(APPLY_PATH, data=new, headers={"authorization": "Bearer nope"})).status == 401
    r = await client.post(APPLY_PATH, data=new, headers={"authorization": "Bearer s3cret", APPLIED_BY_HEADER: "ops@host"})
    assert r.status == 200
    st = await (await client.get(STATUS_PATH)).json()
    assert st["applied_by"] == "ops@host" and st["version"] == config_version(new)
    poll = await client.get(CONFIG_PATH, params={"have": "", "worker": "w"})
    assert (await poll.json())["applied_by"] == "ops@host"


async def test_the_file_watch_applies_each_new_content_once(tmp_path, base: dict[str, Any]) -> None:
    from controlplane.live.watch import watch_file

    path = tmp_path / "modelyard.yaml"
    path.write_bytes(text_of(base))
    live = LiveConfig(ENV, candidate(path.read_bytes(), ENV, None), timeout_s=2.0)
    task = asyncio.create_task(watch_file(path, live, interval_s=0.05))
    try:
        new = text_of(with_model(base))
        # A ConfigMap update swaps a symlink: the content changes under the same name.
        (tmp_path / "next.yaml").write_bytes(new)
        (tmp_path / "next.yaml").replace(path)
        for _ in range(200):
            if live.running.version == config_version(new):
                break
            await asyncio.sleep(0.05)
        assert live.running.version == config_version(new) and live.applied_by == "file watch"
        path.write_bytes(b"models: [")
        await asyncio.sleep(0.5)  # ten polls of a broken file: one failed apply, nothing changed
        assert live.running.version == config_version(new)
        assert live.counts.applies == {"ok": 1, "invalid": 1}
    finally:
        task.cancel()


def test_a_poll_with_the_refused_version_does_not_count_as_running_it() -> None:
    subs = Subscribers()
    subs.polled("w", "v1")
    subs.acked("w", "v2", ok=False, error="bad limit")
    subs.polled("w", "v2")  # the extproc asks with the last version it was offered
    assert subs.workers["w"].version == "v1"
    assert subs.progress("v2").refused == {"w": "bad limit"}


async def test_the_text_endpoint_keeps_the_previous_text_and_the_applies(client: TestClient,
                                                                          base: dict[str, Any]) -> None:
    """`TEXT_PATH`, for the console's Config page: the running text, the one it replaced, who applied what."""
    live = live_of(client)
    v0, old = live.running.version, live.running.text.decode()
    start = await (await client.get(TEXT_PATH)).json()
    assert start["version"] == v0 and start["yaml"] == old and start["previous"] is None and start["history"] == []
    assert (await client.post(APPLY_PATH, data=b"models: [")).status == 400
    worker = asyncio.create_task(subscriber(client, "w0", v0))
    await asyncio.sleep(0.2)
    new = text_of(with_model(base))
    r = await client.post(APPLY_PATH, data=new, headers={"x-modelyard-applied-by": "console:abc@1.2.3.4"})
    assert r.status == 200, await r.text()
    await worker
    doc = await (await client.get(TEXT_PATH)).json()
    assert doc["version"] == config_version(new) and doc["yaml"] == new.decode()
    assert doc["previous"] == {"version": v0, "yaml": old}
    assert [(h["status"], h["applied_by"]) for h in doc["history"]] == [(400, "unknown"), (200, "console:abc@1.2.3.4")]
    assert "not valid YAML" in doc["history"][0]["error"] and doc["history"][1]["version"] == config_version(new)
