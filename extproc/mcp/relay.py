"""The extproc's SSE relay for `/mcp` streams (docs/mcp.md "Streams and resumption").

An ext_proc reply is one body, so a stream cannot be one. For a `tools/call` the client takes as SSE,
and for `GET /mcp`, the ext_proc step authenticates, checks the session, the tool and the limits as
for any call, prepares a `Job` under a random single-use ticket, and sends the request on through
Envoy to this relay (in the same process: the ticket never leaves it), which streams the answer:
every message first appended to the event store under `<stream>-<seq>`, then written with that id.

A call is carried to its end even when the client leaves (the job runs beside the handler), so a
client that resumes with `Last-Event-ID`, on any replica, gets every message exactly once; a
replica that dies mid-call leaves a stream whose deadline passes: a resumer ends it with an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from adapters.mcp.jsonrpc import GATEWAY_ERROR, SESSION_ERROR, RpcError, error_body, sse_event
from contracts.envoy_names import MCP_TICKET_HEADER
from extproc.mcp import metrics
from extproc.mcp.events import EventStore, StreamInfo, event_id
from extproc.mcp.sessions import SessionStoreDown

log = logging.getLogger("modelyard.mcp.relay")

Emit = Callable[[dict[str, Any]], Awaitable[None]]
Pump = Callable[[Emit], Coroutine[Any, Any, None]]

_TICKET_TTL_S = 30.0  # Envoy dials the relay right after the ext_proc step: seconds, not minutes
_FOLLOW_S = 0.05  # how often a resumer polls the store for a stream another replica carries
KEEPALIVE_S = 15.0  # a comment on an idle GET stream: Envoy's stream idle timer must not cut it
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@dataclass(slots=True)
class Job:
    """What the relay does for one ticket."""

    kind: str  # "call" | "listen" | "resume"
    session: str  # the client session
    rid: Any = None  # a call's JSON-RPC id (its error, if the carrier dies)
    pump: Pump | None = None  # a call's upstream call, a listen's upstream GET streams
    deadline: float = 0.0  # a call: when it must have ended
    prime: bool = False  # 2025-11-25 clients: an empty first event with an id, resumable at once
    stream: str | None = None  # resume: the stream ...
    after: int = 0  # ... and the last event the client got


class McpRelay:
    """An aiohttp server on `host` (port 0: Envoy is told each time), started on first use."""

    def __init__(self, host: str | None, events: EventStore) -> None:
        self.host = host  # None: bind every interface, name this host's address
        self.events = events
        self._tickets: dict[str, tuple[float, Job]] = {}
        self._runner: web.AppRunner | None = None
        self._address: str | None = None
        self._lock = asyncio.Lock()
        self._carried: set[asyncio.Task[None]] = set()  # calls running beside (or after) their clients

    async def address(self) -> str:
        async with self._lock:
            if self._address is None:
                app = web.Application()
                app.router.add_route("*", "/{tail:.*}", self._handle)
                # A client that leaves cancels its handler at once (a GET stream otherwise waits for its next write).
                runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True,
                                       shutdown_timeout=1.0)
                await runner.setup()
                site = web.TCPSite(runner, self.host or "0.0.0.0", 0, reuse_address=True)
                await site.start()
                port = runner.addresses[0][1]
                self._runner, self._address = runner, f"{self.host or await _own_address()}:{port}"
                log.info("mcp relay listening on %s", self._address)
            return self._address

    def issue(self, job: Job) -> str:
        now = time.monotonic()
        for t in [t for t, (at, _) in self._tickets.items() if now - at > _TICKET_TTL_S]:
            del self._tickets[t]
        ticket = os.urandom(16).hex()
        self._tickets[ticket] = (now, job)
        return ticket

    async def close(self) -> None:
        for task in list(self._carried):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- one request from Envoy -----------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        found = self._tickets.pop(request.headers.get(MCP_TICKET_HEADER, ""), None)
        if found is None:  # never 5xx: Envoy's retry policy must not send it again
            return web.Response(status=409, content_type="application/json",
                                body=error_body(RpcError(GATEWAY_ERROR, "this stream was already answered")))
        job = found[1]
        metrics.STREAMS.labels(job.kind).inc()
        try:
            if job.kind == "call":
                return await self._call(request, job)
            if job.kind == "resume":
                return await self._resume(request, job)
            return await self._listen(request, job, uuid.uuid4().hex, 0, new=True)
        except SessionStoreDown as e:
            log.warning("mcp event store: %s", e)
            return web.Response(status=503, content_type="application/json", headers={"retry-after": "1"},
                                body=error_body(RpcError(GATEWAY_ERROR, "the MCP event store cannot be reached; "
                                                         "retry shortly", id=job.rid)))

    async def _call(self, request: web.Request, job: Job) -> web.StreamResponse:
        pump = job.pump
        assert pump is not None
        stream = uuid.uuid4().hex
        await self.events.open(stream, job.session, "call", job.deadline, job.rid)
        queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        ended = False

        async def emit(doc: dict[str, Any]) -> None:
            nonlocal ended
            data = orjson.dumps(doc)
            last = "method" not in doc  # the call's response: the stream's end, stored with it
            queue.put_nowait((await self.events.append(stream, data, last), data))
            ended = ended or last

        async def carry() -> None:
            try:
                await pump(emit)
            except Exception:  # our bug: the client still gets an answer for its id
                log.exception("mcp relay: a call failed")
                with contextlib.suppress(Exception):
                    await emit(orjson.loads(error_body(RpcError(GATEWAY_ERROR, "the gateway failed this call",
                                                                id=job.rid))))
            finally:
                if not ended:
                    with contextlib.suppress(Exception):
                        await self.events.end(stream)
                queue.put_nowait(None)

        task = asyncio.create_task(carry())
        self._carried.add(task)
        task.add_done_callback(self._carried.discard)
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await resp.prepare(request)
            if job.prime:
                await resp.write(b"id: " + event_id(stream, 0).encode() + b"\ndata: \n\n")
            while (item := await queue.get()) is not None:
                await resp.write(sse_event(item[1], event_id(stream, item[0])))
                metrics.EVENTS.labels("live").inc()
        except ConnectionError:
            pass  # the client left (a cancel, too): the call goes on to its end, into the store, for a resume
        return resp

    async def _resume(self, request: web.Request, job: Job) -> web.StreamResponse:
        assert job.stream is not None
        info = await self.events.info(job.stream)
        if info is None or info.session != job.session:  # another session's stream answers as an unknown one
            return web.Response(status=404, content_type="application/json",
                                body=error_body(RpcError(SESSION_ERROR, "Stream not found")))
        if info.kind == "listen":
            return await self._listen(request, job, job.stream, job.after, new=False)
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        try:
            await resp.prepare(request)
            await self._replay(resp, job.stream, job.after, info)
        except ConnectionError:
            pass
        return resp

    async def _replay(self, resp: web.StreamResponse, stream: str, seq: int, info: StreamInfo) -> None:
        """What followed `seq` on a call stream, then what comes, until the call ends."""
        while True:
            rows, done = await self.events.after(stream, seq)
            for s, data in rows:
                await resp.write(sse_event(data, event_id(stream, s)))
                metrics.EVENTS.labels("replayed").inc()
                seq = s
            if done:
                return
            if time.time() > info.deadline:
                # The replica carrying the call stopped: the caller's id still gets its answer.
                lost = RpcError(GATEWAY_ERROR, "the gateway replica carrying this call stopped", id=info.rid,
                                status=502)
                data = error_body(lost)
                s = await self.events.append(stream, data, last=True)
                await resp.write(sse_event(data, event_id(stream, s)))
                return
            await asyncio.sleep(_FOLLOW_S)

    async def _listen(self, request: web.Request, job: Job, stream: str, seq: int, *, new: bool
                      ) -> web.StreamResponse:
        """The session's GET stream: the servers' own GET streams, merged, each message numbered;
        on a resume, what the store holds after `seq` first. Ends when the client leaves."""
        if new:
            await self.events.open(stream, job.session, "listen", 0.0, None)
        queue: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()

        async def emit(doc: dict[str, Any]) -> None:
            data = orjson.dumps(doc)
            queue.put_nowait((await self.events.append(stream, data), data))

        resp = web.StreamResponse(headers=_SSE_HEADERS)
        pump = asyncio.create_task(job.pump(emit)) if job.pump is not None else None
        try:
            await resp.prepare(request)
            if new and job.prime:
                await resp.write(b"id: " + event_id(stream, 0).encode() + b"\ndata: \n\n")
            rows, _ = await self.events.after(stream, seq)
            for s, data in rows:  # a resume: what was stored after the client's last event
                await resp.write(sse_event(data, event_id(stream, s)))
                metrics.EVENTS.labels("replayed").inc()
                seq = s
            while True:
                try:
                    s, data = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
                except TimeoutError:
                    await resp.write(b": keepalive\n\n")
                    continue
                if s > seq:  # replayed above already when it was stored before the replay read
                    await resp.write(sse_event(data, event_id(stream, s)))
                    metrics.EVENTS.labels("live").inc()
                    seq = s
        except ConnectionError:
            pass
        finally:
            if pump is not None:
                pump.cancel()
        return resp


async def _own_address() -> str:
    """This host's address as its hostname resolves (a pod's or a container's IP), else loopback."""
    try:
        found = await asyncio.get_running_loop().getaddrinfo(socket.gethostname(), None, family=socket.AF_INET)
        return str(found[0][4][0])
    except (OSError, IndexError):
        return "127.0.0.1"
