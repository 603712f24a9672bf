"""A local stdio MCP server as a streamable-HTTP one, so the gateway speaks only HTTP upstream.

    python -m devstack.mcp_bridge --listen 127.0.0.1:8132 -- python -m devstack.demo.mcp_stdio_server

One stdio process per MCP session (a stdio server serves one client): `initialize` starts it and
names the session; a request's answer is an SSE stream of the notifications that carry its progress
token, then its response; DELETE (or the process dying) ends the session. `modelyard up` runs one
bridge per `mcp_servers` entry with a `command`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import uuid
from typing import Any

import orjson
from aiohttp import web

log = logging.getLogger("modelyard.mcp_bridge")
_SESSION = "Mcp-Session-Id"
_LINE_LIMIT = 64 * 1024 * 1024


class StdioSession:
    """One child process and the requests waiting on its answers."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.waiting: dict[Any, asyncio.Queue[dict[str, Any] | None]] = {}
        self.progress: dict[Any, Any] = {}  # progress token -> request id
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            try:
                doc = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(doc, dict):
                continue
            if "method" in doc and "id" in doc:  # the server asks the client something: no client here to ask
                await self.send({"jsonrpc": "2.0", "id": doc["id"],
                                 "error": {"code": -32601, "message": "not supported through the gateway"}})
            elif "method" in doc:
                token = (doc.get("params") or {}).get("progressToken")
                rid = self.progress.get(token)
                if rid in self.waiting:
                    self.waiting[rid].put_nowait(doc)
            elif doc.get("id") in self.waiting:
                self.waiting[doc["id"]].put_nowait(doc)
        for q in self.waiting.values():  # the process ended: every waiting answer ends unanswered
            q.put_nowait(None)

    async def send(self, doc: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(orjson.dumps(doc) + b"\n")
        await self.proc.stdin.drain()

    def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


class Bridge:
    def __init__(self, command: list[str]) -> None:
        self.command = [sys.executable, *command[1:]] if command[0] in ("python", "python3") else command
        self.sessions: dict[str, StdioSession] = {}

    async def post(self, request: web.Request) -> web.StreamResponse:
        try:
            doc = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, None, -32700, "Parse error")
        if not isinstance(doc, dict):
            return _error(400, None, -32600, "Invalid Request: one JSON-RPC object per POST")
        sid = request.headers.get(_SESSION)
        if doc.get("method") == "initialize":
            sid = uuid.uuid4().hex
            proc = await asyncio.create_subprocess_exec(*self.command, stdin=asyncio.subprocess.PIPE,
                                                        stdout=asyncio.subprocess.PIPE, limit=_LINE_LIMIT)
            self.sessions[sid] = StdioSession(proc)
        session = self.sessions.get(sid or "")
        if session is None or session.proc.returncode is not None:
            return _error(404, doc.get("id"), -32001, "Session not found")
        if "method" not in doc or "id" not in doc:  # a notification or an answer: nothing comes back
            await session.send(doc)
            return web.Response(status=202)
        rid = doc["id"]
        token = ((doc.get("params") or {}).get("_meta") or {}).get("progressToken")
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        session.waiting[rid] = q
        if token is not None:
            session.progress[token] = rid
        try:
            await session.send(doc)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               _SESSION: sid or ""})
            await resp.prepare(request)
            while True:
                msg = await q.get()
                if msg is None:
                    break  # the process died: the stream ends without an answer
                await resp.write(b"event: message\ndata: " + orjson.dumps(msg) + b"\n\n")
                if "method" not in msg:
                    break
            await resp.write_eof()
            return resp
        finally:
            session.waiting.pop(rid, None)
            session.progress.pop(token, None)

    async def delete(self, request: web.Request) -> web.Response:
        session = self.sessions.pop(request.headers.get(_SESSION, ""), None)
        if session is None:
            return web.Response(status=404)
        session.stop()
        return web.Response(status=200)

    async def close(self, _app: web.Application) -> None:
        for s in self.sessions.values():
            s.stop()
            with contextlib.suppress(Exception):
                await s.proc.wait()


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
    app.on_cleanup.append(bridge.close)
    logging.basicConfig(level=logging.WARNING)
    web.run_app(app, host=host, port=int(port), print=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
