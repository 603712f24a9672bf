"""The batch desk's native path without Envoy: a provider that cannot be reached at creation is a 503
with nothing stored; lines the provider cannot take are refused into the error file before it is asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from contracts.config import BatchesConfig, TasksConfig, parse_config
from contracts.errors import Unavailable
from extproc.batches.desk import BatchDesk
from extproc.batches.native import NativeTarget
from extproc.tasks.board import TaskBoard
from extproc.tasks.marker import ReplayMarker
from extproc.tasks.store import SqliteTaskStore
from tests.stack_config import free_port

TARGET = NativeTarget("gw-claude", "c-anthropic", "anthropic", "claude-x")


def _desk(tmp_path: Path) -> BatchDesk:
    port = free_port()  # nothing listens there: the provider is away
    config = parse_config({
        "listener": {"address": "127.0.0.1", "port": free_port()},
        "tenants": [{"name": "acme", "api_keys": ["0" * 64]}],
        "models": [{"name": "gw-claude", "deployments": [{
            "cluster": "c-anthropic", "protocol": "anthropic", "endpoints": [f"127.0.0.1:{port}"],
            "batch": {"mode": "native", "poll_every_s": 1}}]}]})
    tasks = TasksConfig(sqlite_path=str(tmp_path / "tasks.sqlite"))
    board = TaskBoard(tasks, "http://127.0.0.1:1", SqliteTaskStore(tasks.sqlite_path), ReplayMarker(None), {})
    return BatchDesk(BatchesConfig(sqlite_path=str(tmp_path / "batches.sqlite")), board, config=config)


def _line(cid: str, messages: object) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "gw-claude", "messages": messages}})


def test_an_unreachable_provider_is_a_503_and_nothing_is_stored(tmp_path: Path) -> None:
    async def go() -> None:
        desk = _desk(tmp_path)
        f = await desk.upload("acme", "in.jsonl", "batch", _line("a", [{"role": "user", "content": "hi"}]))
        with pytest.raises(Unavailable) as e:
            await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None, lambda models: TARGET)
        assert e.value.status == 503
        found, _ = await desk.list("acme", "openai", 10, None)
        assert found == []
        await desk.close()

    asyncio.run(go())


def test_lines_the_provider_cannot_take_are_refused_before_it_is_asked(tmp_path: Path) -> None:
    async def go() -> None:
        desk = _desk(tmp_path)
        f = await desk.upload("acme", "in.jsonl", "batch", _line("bad", "not a list of messages"))
        # every line refused: the provider is never asked (it is away), the batch ends with its error file
        batch = await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None, lambda models: TARGET)
        rec, counts = await desk.batch(batch.id, "acme", "openai")
        assert rec.status == "completed" and counts == {"total": 1, "completed": 0, "failed": 1}
        (row,) = [orjson.loads(x) for x in (await desk.file_content(rec.error_file_id or "", "acme")).splitlines()]
        assert row["custom_id"] == "bad" and row["error"]["code"] == "invalid_request"
        await desk.close()

    asyncio.run(go())


class _Rows:
    """What the desk hands the metering store and the budgets: the rows and spend, as given."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.spend: list[tuple[str, str | None, float]] = []

    def record(self, row: tuple) -> bool:
        self.rows.append(row)
        return True

    def record_spend(self, tenant: str, key_id: str | None, usd: float) -> None:
        self.spend.append((tenant, key_id, usd))


def test_the_poller_brings_an_anthropic_providers_results_back_and_meters_each_line_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo Anthropic provider in this process (its Message Batches); an OpenAI batch translated."""
    from aiohttp import web

    from devstack.demo import batch_api
    from devstack.demo.anthropic_server import make_app

    monkeypatch.setattr(batch_api, "BATCH_SECONDS", 0.0)  # the demo ends a batch at its first look

    async def go() -> None:
        runner = web.AppRunner(make_app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            config = parse_config({
                "listener": {"address": "127.0.0.1", "port": free_port()},
                "tenants": [{"name": "acme", "api_keys": ["0" * 64]}],
                "models": [{"name": "gw-claude", "cost": {"input_per_1k": 3.0, "output_per_1k": 15.0,
                                                          "batch_discount": 0.5},
                            "deployments": [{"cluster": "c-anthropic", "protocol": "anthropic",
                                             "endpoints": [f"127.0.0.1:{port}"],
                                             "batch": {"mode": "native", "poll_every_s": 0.01}}]}]})
            tasks = TasksConfig(sqlite_path=str(tmp_path / "tasks.sqlite"))
            board = TaskBoard(tasks, "http://127.0.0.1:1", SqliteTaskStore(tasks.sqlite_path), ReplayMarker(None), {})
            seen = _Rows()
            desk = BatchDesk(BatchesConfig(sqlite_path=str(tmp_path / "batches.sqlite")), board, config=config,
                             metering=seen, budgets=seen)  # type: ignore[arg-type]
            f = await desk.upload("acme", "in.jsonl", "batch", b"\n".join(
                _line(c, [{"role": "user", "content": f"hello {c}"}]) for c in ("a", "b")))
            batch = await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None,
                                             lambda models: TARGET, key_id="key-1")
            assert batch.native is not None and batch.native["upstream_id"].startswith("msgbatch_demo")
            await desk._pass()
            await desk._pass()  # another finalizer's look after it closed: nothing twice
            rec, counts = await desk.batch(batch.id, "acme", "openai")
            assert rec.status == "completed" and counts == {"total": 2, "completed": 2, "failed": 0}
            out = [orjson.loads(x) for x in (await desk.file_content(rec.output_file_id or "", "acme")).splitlines()]
            assert [r["response"]["body"]["choices"][0]["message"]["content"][-7:] for r in out] == ["hello a",
                                                                                                      "hello b"]
            assert [r[1] for r in seen.rows] == [f"{batch.id}-1", f"{batch.id}-2"]
            assert all(r[4] == "gw-claude" and r[7] == 200 and r[13] == "native-batch" and r[15] == "key-1"
                       for r in seen.rows)
            for r, (tenant, key, usd) in zip(seen.rows, seen.spend, strict=True):
                assert (tenant, key) == ("acme", "key-1")
                assert usd == r[12] == pytest.approx((r[10] * 3.0 + r[11] * 15.0) / 1000 * 0.5)
            await desk.close()
        finally:
            await runner.cleanup()

    asyncio.run(go())
