"""What the native-batch e2e modules (OpenAI/Anthropic, Bedrock, Vertex) share: a batch line, one
OpenAI batch created and polled to its end, its JSONL files read, its lines' metering rows, and the
demo providers' batch duration set for a module's stack."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import openai


def chat_line(custom_id: str, model: str, text: str) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 32}})


def openai_batch(oai: openai.OpenAI, lines: list[str]) -> Any:
    f = oai.files.create(file=("in.jsonl", io.BytesIO(("\n".join(lines) + "\n").encode())), purpose="batch")
    return oai.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")


def until_done(oai: openai.OpenAI, batch_id: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while (b := oai.batches.retrieve(batch_id)).status not in ("completed", "failed", "cancelled", "expired"):
        assert time.monotonic() < deadline, b
        time.sleep(0.2)
    return b


def jsonl(raw: bytes) -> list[dict]:
    return [json.loads(x) for x in raw.decode().splitlines() if x.strip()]


def metered(stack: Any, batch_id: str, n: int) -> list[tuple]:
    """The batch's metering rows (task id, model, status, tokens in/out, cost, strategy), once n are in."""
    rows: list = []
    deadline = time.monotonic() + 10
    while len(rows) < n and time.monotonic() < deadline:
        with sqlite3.connect(stack.cfg.extproc.metering_db) as db:
            rows = db.execute("SELECT task_id, model, status, input_tokens, output_tokens, cost, strategy FROM "
                              "requests WHERE task_id LIKE ? ORDER BY task_id", (batch_id + "-%",)).fetchall()
        time.sleep(0.1)
    return rows


@contextmanager
def demo_batch_seconds(seconds: str) -> Iterator[None]:
    """The demo providers end a batch this long after it was created (MODELYARD_DEMO_BATCH_SECONDS)."""
    before = os.environ.get("MODELYARD_DEMO_BATCH_SECONDS")
    os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = seconds
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MODELYARD_DEMO_BATCH_SECONDS", None)
        else:
            os.environ["MODELYARD_DEMO_BATCH_SECONDS"] = before
