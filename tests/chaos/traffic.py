"""A load loop that keeps every request's story: status, who answered, its task id, when its
first byte came, whether a stream ended properly. wrk only counts; faults need the detail."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tests.conftest import DEMO_KEY

PINNED = {"x-modelyard-strategy": "pinned"}  # quality only: ties go to the first deployment in config


@dataclass
class Shot:
    """One request as the client saw it."""

    started: float
    ended: float = 0.0
    stream: bool = False
    status: int | str = "not sent"  # an HTTP status, or a transport error's name
    cluster: str = ""
    task_id: str = ""
    first_byte: float | None = None
    complete: bool = False  # a whole JSON reply, or a stream that reached [DONE]
    abandoned: bool = False  # the client left on purpose
    body: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.complete


def chat_body(model: str, text: str, *, stream: bool = False) -> dict:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": text}]}


async def send(client: httpx.AsyncClient, url: str, body: dict, *, key: str = DEMO_KEY,
               headers: dict[str, str] | None = None, leave_after_chunks: int | None = None) -> Shot:
    """One chat request; with `leave_after_chunks` the client drops a stream after that many chunks."""
    shot = Shot(started=time.monotonic(), stream=bool(body.get("stream")))
    hdrs = {"authorization": f"Bearer {key}", **PINNED, **(headers or {})}
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=hdrs) as r:
            shot.status = r.status_code
            shot.cluster = r.headers.get("x-modelyard-cluster", "")
            shot.task_id = r.headers.get("x-modelyard-task-id", "")
            chunks: list[str] = []
            async for chunk in r.aiter_text():
                if shot.first_byte is None:
                    shot.first_byte = time.monotonic()
                chunks.append(chunk)
                if leave_after_chunks is not None and len(chunks) >= leave_after_chunks:
                    shot.abandoned = True
                    break
            shot.body = "".join(chunks)
    except httpx.TransportError as e:
        shot.status = type(e).__name__
    shot.ended = time.monotonic()
    if shot.status == 200 and not shot.abandoned:
        shot.complete = ("data: [DONE]" in shot.body and '"error"' not in shot.body) if shot.stream \
            else shot.body.startswith("{") and '"choices"' in shot.body
    return shot


def client(concurrency: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency * 2,
                                                             max_keepalive_connections=concurrency))


async def load(url: str, seconds: float, concurrency: int, make: Callable[[int], dict], *,
               during: Callable[[], object] | None = None, at: float = 0.0) -> list[Shot]:
    """`concurrency` workers send `make(i)` bodies for `seconds`; `during()` runs (in a thread)
    `at` seconds in: the fault."""
    shots: list[Shot] = []
    deadline = time.monotonic() + seconds
    counter = iter(range(10**9))

    async def worker(c: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            shots.append(await send(c, url, make(next(counter))))

    async def fault() -> None:
        await asyncio.sleep(at)
        if during is not None:
            await asyncio.to_thread(during)

    async with client(concurrency) as c:
        await asyncio.gather(fault(), *(worker(c) for _ in range(concurrency)))
    return shots


async def disconnecting_streams(url: str, model: str, count: int, concurrency: int, *,
                                seed: int = 7) -> list[Shot]:
    """`count` streams, each dropped by the client after a random number of chunks."""
    rng = random.Random(seed)
    queue = list(range(count))
    shots: list[Shot] = []

    async def worker(c: httpx.AsyncClient) -> None:
        while queue:
            queue.pop()
            body = chat_body(model, "tell me a story about chaos and order in many words", stream=True)
            shots.append(await send(c, url, body, leave_after_chunks=rng.randint(1, 4)))

    async with client(concurrency) as c:
        await asyncio.gather(*(worker(c) for _ in range(concurrency)))
    return shots
