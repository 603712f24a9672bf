"""A local stdio MCP server as a streamable-HTTP one, so the gateway speaks only HTTP upstream.

    python -m devstack.mcp_bridge --listen 127.0.0.1:8132 -- python -m devstack.demo.mcp_stdio_server

One stdio process for every HTTP session (a process per session would cost each `initialize` a
Python server's cold start, seconds, and a process per client): the bridge initialises it once and
answers each session's `initialize` with that result; requests get ids of the bridge's own (mapped
back on the way out), and a request's progress token is renamed the same way, so each answer and
each progress notification reaches the SSE stream of the request it belongs to. The process dying
ends every open stream unanswered (the gateway answers those calls 502) and the next request starts
it again. `modelyard up` runs one bridge per `mcp_servers` entry with a `command`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import sys
import uuid
from typing import Any

import orjson
from aiohttp import web

log = logging.getLogger("modelyard.mcp_bridge")
_SESSION = "Mcp-Session-Id"
_LINE_LIMIT = 64 * 1024 * 1024
_INIT_TIMEOUT_S = 60.0
Waiting = asyncio.Queue[dict[str, Any] | None]


class StdioServer:
    """The child process, initialised by the bridge, and the requests waiting on its answers."""

    def __init__(self, command: list[str]) -> None:
        self.command = command
        self.proc: asyncio.subprocess.Process | None = None
        self.init_result: dict[str, Any] | None = None
        self.waiting: dict[int, tuple[Any, Waiting]] = {}  # our id -> (the client's id, its stream)
        self.tokens: dict[str, tuple[int, Any]] = {}  # our progress token -> (our id, the client's token)
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._reader: asyncio.Future[None] | None = None

    async def ensure(self) -> None:
        async with self._lock:
            if self.proc is not None and self.proc.returncode is None and self.init_result is not None:
                return
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=_LINE_LIMIT)
            self._reader = asyncio.ensure_future(self._read(self.proc))
            q = self._wait(0)
            await self._write({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "modelyard-mcp-bridge", "version": "1"}}})
            async with asyncio.timeout(_INIT_TIMEOUT_S):
                answer = await q.get()
            self.waiting.pop(0, None)
            if answer is None or not isinstance(answer.get("result"), dict):
                raise RuntimeError(f"the stdio server did not initialise: {answer}")
            self.init_result = answer["result"]
            await self._write({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def _wait(self, our_id: int, client_id: Any = None) -> Waiting:
        q: Waiting = asyncio.Queue()
        self.waiting[our_id] = (client_id, q)
        return q

    async def request(self, doc: dict[str, Any]) -> tuple[int, Waiting]:
        """Send one request under an id of ours; its answer and progress come on the queue."""
        our_id = next(self._ids)
        q = self._wait(our_id, doc["id"])
        params = dict(doc.get("params") or {})
        meta = params.get("_meta")
        if isinstance(meta, dict) and "progressToken" in meta:
            token = f"bridge-{our_id}"
            self.tokens[token] = (our_id, meta["progressToken"])
            params["_meta"] = {**meta, "progressToken": token}
        await self._write({**doc, "id": our_id, "params": params})
        return our_id, q

    def done(self, our_id: int) -> None:
        self.waiting.pop(our_id, None)
        self.tokens.pop(f"bridge-{our_id}", None)

    async def notify(self, doc: dict[str, Any]) -> None:
        if doc.get("method") in ("notifications/initialized", "notifications/cancelled"):
            return  # the bridge initialised the process itself; a cancel names a client id the server never saw
        await self._write(doc)

    async def _write(self, doc: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(doc) + b"\n")
        await self.proc.stdin.drain()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(doc, dict):
                await self._route(doc)
        await proc.wait()
        if proc is not self.proc:
            return  # an older process's end: a newer one serves the waiting requests
        self.init_result = None
        for _client_id, q in list(self.waiting.values()):  # every open stream ends unanswered
            q.put_nowait(None)

    async def _route(self, doc: dict[str, Any]) -> None:
        if "method" in doc and "id" in doc:  # the server asks its client something: nobody to ask here
            await self._write({"jsonrpc": "2.0", "id": doc["id"],
                               "error": {"code": -32601, "message": "not supported through the gateway"}})
        elif "method" in doc:
            params: dict[str, Any] = doc["params"] if isinstance(doc.get("params"), dict) else {}
            found = self.tokens.get(str(params.get("progressToken")))
            if found is not None and found[0] in self.waiting:
                self.waiting[found[0]][1].put_nowait({**doc, "params": {**params, "progressToken": found[1]}})
        elif doc.get("id") in self.waiting:
            client_id, q = self.waiting[doc["id"]]
            q.put_nowait({**doc, "id": client_id})

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            with contextlib.suppress(Exception):
                await self.proc.wait()


class Bridge:
    def __init__(self, command: list[str]) -> None:
        argv = [sys.executable, *command[1:]] if command[0] in ("python", "python3") else command
        self.server = StdioServer(argv)
        self.sessions: set[str] = set()
        self._warming: asyncio.Future[None] | None = None

    async def post(self, request: web.Request) -> web.StreamResponse:
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, None, -32700, "Parse error")
        if not isinstance(doc, dict):
            return _error(400, None, -32600, "Invalid Request: one JSON-RPC object per POST")
        try:
            await self.server.ensure()
        except (OSError, RuntimeError, TimeoutError) as e:
            return _error(502, doc.get("id"), -32603, f"the stdio server cannot start: {e}")
        if doc.get("method") == "initialize":
            sid = uuid.uuid4().hex
            self.sessions.add(sid)
            body = orjson.dumps({"jsonrpc": "2.0", "id": doc.get("id"), "result": self.server.init_result})
            return web.Response(body=body, content_type="application/json", headers={_SESSION: sid})
        sid = request.headers.get(_SESSION, "")
        if sid not in self.sessions:
            return _error(404, doc.get("id"), -32001, "Session not found")
        if "method" not in doc or "id" not in doc:  # a notification or an answer: nothing comes back
            await self.server.notify(doc)
            return web.Response(status=202)
        our_id, q = await self.server.request(doc)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               _SESSION: sid})
            await resp.prepare(request)
            while (msg := await q.get()) is not None:  # None: the process died, the stream ends unanswered
                await resp.write(b"event: message\ndata: " + orjson.dumps(msg) + b"\n\n")
                if "method" not in msg:
                    break
            await resp.write_eof()
            return resp
        finally:
            self.server.done(our_id)

    async def delete(self, request: web.Request) -> web.Response:
        sid = request.headers.get(_SESSION, "")
        if sid not in self.sessions:
            return web.Response(status=404)
        self.sessions.discard(sid)
        return web.Response(status=200)

    async def start(self, _app: web.Application) -> None:
        """Warm: the process starts (and is initialised) before the first client comes."""
        self._warming = asyncio.ensure_future(self._warm())

    async def _warm(self) -> None:
        try:
            await self.server.ensure()
        except (OSError, RuntimeError, TimeoutError) as e:
            log.warning("stdio server not started: %s", e)

    async def close(self, _app: web.Application) -> None:
        await self.server.stop()


def _error(status: int, rid: Any, code: int, message: str) -> web.Response:
    body = orjson.dumps({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})
    return web.Response(status=status, body=body, content_type="application/json")


async def _health(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="a stdio MCP server behind streamable HTTP")
    p.add_argument("--listen", default="127.0.0.1:8132")
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("give the stdio server's command after --")
    host, _, port = args.listen.rpartition(":")
    bridge = Bridge(command)
    app = web.Application(client_max_size=_LINE_LIMIT)
    app.router.add_post("/mcp", bridge.post)
    app.router.add_delete("/mcp", bridge.delete)
    app.router.add_get("/health", _health)
    app.on_startup.append(bridge.start)
    app.on_cleanup.append(bridge.close)
    logging.basicConfig(level=logging.WARNING)
    web.run_app(app, host=host, port=int(port), print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
