"""The batch desk over real SQLite stores, no Envoy: lines become tasks, the finalizer closes a
batch once every line ended (files written once), expiry and cancel, and tenants kept apart.
The line tasks are driven through the task store's own transitions, as the worker would."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import orjson
import pytest

from contracts.config import BatchesConfig, TasksConfig
from contracts.errors import ClientError, NotFound
from extproc.batches import record
from extproc.batches.desk import BatchDesk
from extproc.tasks import state
from extproc.tasks.board import TaskBoard
from extproc.tasks.marker import ReplayMarker
from extproc.tasks.store import SqliteTaskStore


def _desk(tmp_path: Path) -> BatchDesk:
    cfg = TasksConfig(sqlite_path=str(tmp_path / "tasks.sqlite"))
    board = TaskBoard(cfg, "http://127.0.0.1:1", SqliteTaskStore(cfg.sqlite_path), ReplayMarker(None), {})
    return BatchDesk(BatchesConfig(sqlite_path=str(tmp_path / "batches.sqlite"), max_lines=10), board)


def _line(cid: str) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": "user", "content": cid}]}})


async def _run_all(desk: BatchDesk, answer: int = 200) -> None:
    """What the worker does: claim each queued line and store its answer."""
    store = desk.board.store
    while (rec := await store.claim_next(time.time(), "w", 30.0)) is not None:
        body = orjson.dumps({"id": rec.id, "echo": orjson.loads(rec.request.body)["messages"][0]["content"]})
        await store.update(rec.id, lambda r, body=body: state.complete(r, time.time(), "w", answer, body))


def test_a_batch_ends_once_every_line_did_and_writes_its_files_once(tmp_path: Path) -> None:
    async def go() -> None:
        desk = _desk(tmp_path)
        f = await desk.upload("acme", "in.jsonl", "batch", b"\n".join([_line("a"), b"oops", _line("b")]))
        batch = await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None)
        assert batch.status == "in_progress" and len(batch.task_ids) == 2
        rec, counts = await desk.batch(batch.id, "acme", "openai")
        assert rec.open and counts == {"total": 3, "completed": 0, "failed": 1}
        task = await desk.board.store.get(batch.task_ids[0], with_body=True)
        assert task is not None and task.request.path == "/v1/chat/completions" and task.tenant == "acme"
        await _run_all(desk)
        await desk._pass()  # the finalizer
        rec, counts = await desk.batch(batch.id, "acme", "openai")
        assert rec.status == "completed" and counts == {"total": 3, "completed": 2, "failed": 1}
        out = [orjson.loads(x) for x in (await desk.file_content(rec.output_file_id or "", "acme")).splitlines()]
        assert [(r["custom_id"], r["response"]["body"]["echo"]) for r in out] == [("a", "a"), ("b", "b")]
        err = [orjson.loads(x) for x in (await desk.file_content(rec.error_file_id or "", "acme")).splitlines()]
        assert [r["error"]["code"] for r in err] == ["invalid_json_line"]
        assert await desk.store.open_batches() == []
        with pytest.raises(NotFound):
            await desk.batch(batch.id, "other", "openai")
        with pytest.raises(NotFound):
            await desk.batch(batch.id, "acme", "anthropic")  # an OpenAI batch is not Anthropic's
        await desk.close()
        await desk.board.store.close()

    asyncio.run(go())


def test_cancel_and_expiry_end_the_lines_still_waiting(tmp_path: Path) -> None:
    async def go() -> None:
        desk = _desk(tmp_path)
        f = await desk.upload("acme", "in.jsonl", "batch", b"\n".join([_line("a"), _line("b")]))
        cancelled = await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None)
        rec, _ = await desk.cancel(cancelled.id, "acme", "openai")
        assert rec.status == "cancelled" and rec.cancelling_at is not None  # nothing was running
        assert rec.counts == {"total": 2, "completed": 0, "failed": 2}

        doc = {"requests": [{"custom_id": "x", "params": {"model": "m", "max_tokens": 1, "messages": []}}]}
        late = await desk.create_anthropic("acme", doc)
        await desk.store.update_batch(late.id, lambda r: dataclasses.replace(r, expires_at=time.time() - 1))
        await desk._pass()  # expires it: its line is cancelled
        await desk._pass()  # and closes it
        rec, counts = await desk.batch(late.id, "acme", "anthropic")
        assert rec.status == "expired" and counts["expired"] == 1
        assert record.anthropic_view(rec, counts, "u")["processing_status"] == "ended"
        results = orjson.loads(await desk.results(late.id, "acme"))
        assert results == {"custom_id": "x", "result": {"type": "expired"}}
        await desk.close()
        await desk.board.store.close()

    asyncio.run(go())


def test_uploads_are_bounded_and_a_batch_reads_only_batch_files(tmp_path: Path) -> None:
    async def go() -> None:
        desk = _desk(tmp_path)
        with pytest.raises(ClientError) as e:
            await desk.upload("acme", "x", "nonsense", b"{}")
        assert e.value.status == 400
        big = BatchDesk(desk.cfg.model_copy(update={"max_file_bytes": 4}), desk.board, desk.store)
        with pytest.raises(ClientError) as e:
            await big.upload("acme", "x", "batch", b"12345")
        assert e.value.status == 413
        f = await desk.upload("acme", "x", "user_data", _line("a"))
        with pytest.raises(ClientError):
            await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None)
        g = await desk.upload("acme", "x", "batch", _line("a"))
        with pytest.raises(ClientError):
            await desk.create_openai("acme", g.id, "/v1/chat/completions", "1h", None)
        with pytest.raises(NotFound):
            await desk.create_openai("other", g.id, "/v1/chat/completions", "24h", None)
        await desk.close()
        await desk.board.store.close()

    asyncio.run(go())
