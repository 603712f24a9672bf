"""Both task stores against real backends (a SQLite file, a real redis-server): the same
contract, and two workers racing for the same tasks never both get one."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from extproc.tasks import state
from extproc.tasks.redis_store import RedisTaskStore
from extproc.tasks.state import StoredRequest
from extproc.tasks.store import SqliteTaskStore, TaskStore
from tests.ratelimit.redis_server import REDIS_BIN, RedisServer

REQ = StoredRequest("POST", "/v1/chat/completions", (("content-type", "application/json"),), b"{}")


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield lambda: SqliteTaskStore(str(tmp_path / "tasks.sqlite"))
        return
    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    srv = RedisServer()
    srv.start()
    yield lambda: RedisTaskStore(f"redis://127.0.0.1:{srv.port}/0", "test:tasks:")
    srv.stop()


async def test_contract(make_store) -> None:
    store: TaskStore = make_store()
    try:
        for i in range(3):
            await store.create(state.new_task(f"t{i}", "acme", "openai", REQ, 100.0 + i))
        with pytest.raises(ValueError):
            await store.create(state.new_task("t0", "acme", "openai", REQ, 1.0))
        assert (await store.get("t1", with_body=True)).request == REQ
        assert (await store.get("t1")).request.body == b""  # polls never read the body
        assert await store.get("nope") is None
        first = await store.claim_next(200.0, "w1", 10.0)
        assert first is not None and first.id == "t0" and first.status == "running"  # oldest first
        assert first.request == REQ  # the claimer replays it: with its body
        await store.update("t1", lambda r: state.cancel(r, 201.0))
        second = await store.claim_next(201.0, "w1", 10.0)
        assert second is not None and second.id == "t2"  # the cancelled one is skipped
        assert await store.claim_next(202.0, "w2", 10.0) is None
        retried = await store.claim_next(215.0, "w2", 10.0)  # t0's lease ran out
        assert retried is not None and retried.id == "t0" and retried.retried and retried.attempts == 2
        assert await store.update("t0", lambda r: state.complete(r, 216.0, "w1", 200, b"{}")) is None
        done = await store.update("t0", lambda r: state.complete(r, 216.0, "w2", 200, b'{"a":1}'))
        assert done is not None and (await store.get("t0")).result == b'{"a":1}'
        assert (await store.get("t0", with_body=True)).request == REQ  # updates leave the body as it was
        assert await store.purge(216.0 + 50, 100.0) == 0
        assert await store.purge(216.0 + 150, 100.0) == 2  # t0 and the cancelled t1
        assert await store.get("t0") is None and await store.get("t2") is not None
    finally:
        await store.close()


async def test_owed_webhooks_until_a_receiver_takes_them(make_store) -> None:
    store: TaskStore = make_store()
    try:
        await store.create(state.new_task("hook", "acme", "openai", REQ, 1.0, callback_url="http://r/x"))
        await store.create(state.new_task("plain", "acme", "openai", REQ, 2.0))
        for _ in range(2):
            rec = await store.claim_next(3.0, "w", 10.0)
            assert rec is not None
            await store.update(rec.id, lambda r: state.complete(r, 4.0, "w", 200, b"{}"))
        assert [r.id for r in await store.owed_webhooks(10)] == ["hook"]
        await store.update("hook", state.mark_notified)
        assert await store.owed_webhooks(10) == []
    finally:
        await store.close()


async def test_racing_workers_never_share_a_task(make_store) -> None:
    a, b = make_store(), make_store()  # two connections: two processes or replicas
    try:
        for i in range(40):
            await a.create(state.new_task(f"t{i:02d}", "acme", "openai", REQ, float(i)))

        async def drain(store: TaskStore, owner: str) -> list[str]:
            got = []
            while (rec := await store.claim_next(1000.0, owner, 60.0)) is not None:
                got.append(rec.id)
            return got

        ga, gb = await asyncio.gather(drain(a, "A"), drain(b, "B"))
        assert sorted(ga + gb) == [f"t{i:02d}" for i in range(40)]
        assert not set(ga) & set(gb)
    finally:
        await a.close()
        await b.close()


async def test_sqlite_survives_reopening(tmp_path: Path) -> None:
    path = str(tmp_path / "t.sqlite")
    s = SqliteTaskStore(path)
    await s.create(state.new_task("keep", "acme", "openai", REQ, 1.0))
    await s.claim_next(2.0, "gone", 5.0)
    await s.close()
    s = SqliteTaskStore(path)  # a restarted extproc
    try:
        rec = await s.claim_next(10.0, "new", 5.0)
        assert rec is not None and rec.id == "keep" and rec.retried and rec.attempts == 2
    finally:
        await s.close()


async def test_a_batch_of_tasks_at_once(make_store) -> None:
    """A batch's lines: created together (one transaction in SQLite), read back together with results."""
    store: TaskStore = make_store()
    try:
        await store.create_many([state.new_task(f"b-{i}", "acme", "openai", REQ, 100.0 + i) for i in range(3)])
        await store.update("b-1", lambda r: state.cancel(r, 101.0))
        got = await store.get_many(["b-0", "b-1", "b-2", "nope"])
        assert sorted(got) == ["b-0", "b-1", "b-2"] and got["b-1"].status == "cancelled"
        assert (await store.get("b-2", with_body=True)).request == REQ
        assert (await store.claim_next(200.0, "w", 10.0)).id == "b-0"
    finally:
        await store.close()
