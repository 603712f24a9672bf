"""The S3 file store against moto's S3 server (tests/moto_s3.py; IAM checks on, so each request's
SigV4 signature is verified): uploads and batch outputs land in the bucket, SQLite keeps only their
records, tenants stay apart, a wrong secret is a 503 that logs no credential, and bytes stored
before the bucket was configured are still read from SQLite."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import orjson
import pytest

from contracts.config import BatchesConfig, S3FileStore, TasksConfig
from contracts.errors import NotFound, Unavailable
from extproc.batches.desk import BatchDesk
from extproc.tasks import state
from extproc.tasks.board import TaskBoard
from extproc.tasks.marker import ReplayMarker
from extproc.tasks.store import SqliteTaskStore
from tests.moto_s3 import S3Server, moto_s3


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as server:
        yield server


def _desk(tmp_path: Path, s3: S3Server | None, creds: Path | None = None) -> BatchDesk:
    cfg = TasksConfig(sqlite_path=str(tmp_path / "tasks.sqlite"))
    board = TaskBoard(cfg, "http://127.0.0.1:1", SqliteTaskStore(cfg.sqlite_path), ReplayMarker(None), {})
    store = None
    if s3 is not None:
        assert creds is not None
        store = S3FileStore(endpoint=s3.endpoint, bucket=s3.bucket, prefix="gw/", credentials_file=str(creds))
    return BatchDesk(BatchesConfig(sqlite_path=str(tmp_path / "batches.sqlite"), file_store=store), board)


def _creds(path: Path, key: str, secret: str) -> Path:
    path.write_text(f"[default]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")
    return path


def _line(cid: str) -> bytes:
    return orjson.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "m", "messages": [{"role": "user", "content": cid}]}})


def test_files_and_batch_outputs_live_in_the_bucket(tmp_path: Path, s3: S3Server) -> None:
    async def go() -> None:
        desk = _desk(tmp_path, s3, _creds(tmp_path / "creds", s3.access_key, s3.secret_key))
        data = b"\n".join([_line("a"), _line("b")])
        f = await desk.upload("acme", "in.jsonl", "batch", data)
        assert await desk.file_content(f.id, "acme") == data
        with pytest.raises(NotFound):  # another tenant: not found, bucket or not
            await desk.file_content(f.id, "globex")
        batch = await desk.create_openai("acme", f.id, "/v1/chat/completions", "24h", None)
        store = desk.board.store
        while (t := await store.claim_next(time.time(), "w", 30.0)) is not None:
            await store.update(t.id, lambda r: state.complete(r, time.time(), "w", 200, b'{"ok": true}'))
        await desk._pass()
        rec, _ = await desk.batch(batch.id, "acme", "openai")
        assert rec.status == "completed" and rec.output_file_id
        out = await desk.file_content(rec.output_file_id, "acme")
        assert [orjson.loads(x)["custom_id"] for x in out.splitlines()] == ["a", "b"]
        keys = s3.object_keys()
        assert any(k.endswith("/" + f.id) for k in keys) and any(k.endswith("/" + rec.output_file_id) for k in keys)
        assert all(k.startswith("gw/") and "acme" not in k for k in keys)  # the tenant as a digest
        # SQLite holds the records, not the bytes
        assert await desk.store.file_data(f.id, "acme") == b""
        await desk.delete_file(f.id, "acme")
        assert not any(k.endswith("/" + f.id) for k in s3.object_keys())
        with pytest.raises(NotFound):
            await desk.file_content(f.id, "acme")
        await desk.close()

    asyncio.run(go())


def test_a_wrong_secret_is_a_503_and_logs_no_credential(tmp_path: Path, s3: S3Server,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    async def go() -> None:
        desk = _desk(tmp_path, s3, _creds(tmp_path / "creds", s3.access_key, "not-the-secret-" + "x" * 24))
        with pytest.raises(Unavailable) as e:
            await desk.upload("acme", "in.jsonl", "batch", b"data")
        assert e.value.status == 503
        assert (await desk.list_files("acme", None, 10, None))["data"] == []  # no record without its bytes
        await desk.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(go())
    assert "SignatureDoesNotMatch" in caplog.text
    assert "not-the-secret" not in caplog.text and s3.access_key not in caplog.text


def test_bytes_stored_before_the_bucket_was_configured_are_still_read(tmp_path: Path, s3: S3Server) -> None:
    async def go() -> None:
        before = _desk(tmp_path, None)
        f = await before.upload("acme", "old.jsonl", "batch", b"old bytes")
        await before.close()
        after = _desk(tmp_path, s3, _creds(tmp_path / "creds", s3.access_key, s3.secret_key))
        assert await after.file_content(f.id, "acme") == b"old bytes"
        empty = await after.upload("acme", "empty.jsonl", "user_data", b"")
        assert await after.file_content(empty.id, "acme") == b""
        await after.close()

    asyncio.run(go())
