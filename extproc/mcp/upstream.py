"""One JSON-RPC message to one upstream MCP server over streamable HTTP (aiohttp, on the event
loop, never blocking it): JSON or SSE answers read to the response for our id, the server's
notifications on the way kept in order (progress), failures as the gateway's JSON-RPC errors."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from adapters.mcp.jsonrpc import GATEWAY_ERROR, RequestId, RpcError
from contracts.config.mcp import McpServer

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
_ACCEPT = "application/json, text/event-stream"
_DRAIN_S = 0.05


class SessionLost(Exception):
    """The server no longer knows our upstream session (HTTP 404): initialise again."""


@dataclass(slots=True)
class Answer:
    """What the server sent for one message: its response (None for a notification) and the
    notifications before it, in order; its session id when it gave one."""

    response: dict[str, Any] | None = None
    notifications: list[dict[str, Any]] = field(default_factory=list)
    session_id: str | None = None
    body_bytes: int = 0


def upstream_headers(server: McpServer) -> dict[str, str]:
    """The server's own credentials from the environment (read per call: a rotated secret applies)."""
    out = {}
    for header, env in server.headers_env.items():
        value = os.environ.get(env)
        if value:
            out[header] = value
    return out


class UpstreamClient:
    """One aiohttp session for every server (connections kept alive), made on first use."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(auto_decompress=True, skip_auto_headers=("User-Agent",))
        return self._http

    async def send(self, server: McpServer, message: dict[str, Any], *, session_id: str | None,
                   protocol_version: str | None, rid: RequestId | None = None) -> Answer:
        headers = {"Content-Type": "application/json", "Accept": _ACCEPT, **upstream_headers(server)}
        if session_id:
            headers[SESSION_HEADER] = session_id
        if protocol_version:
            headers[VERSION_HEADER] = protocol_version
        expect = message.get("id")
        try:
            async with asyncio.timeout(server.timeout_s):
                async with self._client().post(server.endpoint, data=orjson.dumps(message), headers=headers) as r:
                    return await _read(server, r, expect, session_id, rid)
        except TimeoutError:
            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} did not answer within {server.timeout_s:g}s",
                           status=504, id=rid, data={"server": server.name}) from None
        except (aiohttp.ClientError, OSError) as e:
            # Refused, reset, or closed mid-answer (a server that died during the call).
            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} failed: {type(e).__name__}",
                           status=502, id=rid, data={"server": server.name}) from None

    async def stream(self, server: McpServer, message: dict[str, Any], *, session_id: str | None,
                     protocol_version: str | None, rid: RequestId | None = None) -> AsyncIterator[dict[str, Any]]:
        """`message`'s answer as it comes: each notification the server sends before its response,
        then the response (last). The caller bounds the whole (the server's timeout_s); failures
        are the gateway's RpcErrors, a lost session `SessionLost` (before anything was yielded)."""
        headers = self._headers(server, session_id, protocol_version)
        expect = message.get("id")
        try:
            async with self._client().post(server.endpoint, data=orjson.dumps(message), headers=headers) as r:
                if r.status == 404 and session_id:
                    raise SessionLost(server.name)
                if not r.headers.get("Content-Type", "").lower().startswith("text/event-stream"):
                    answer = await _read(server, r, expect, session_id, rid)
                    if answer.response is not None:
                        yield answer.response
                    return
                async for payload in _events(r):
                    doc = _json(payload)
                    if not isinstance(doc, dict) or doc.get("jsonrpc") != "2.0":
                        continue
                    if "method" in doc and "id" not in doc:
                        yield doc
                    elif doc.get("id") == expect and ("result" in doc or "error" in doc):
                        await _drain(r)
                        yield doc
                        return
        except (aiohttp.ClientError, OSError) as e:
            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} failed: {type(e).__name__}",
                           status=502, id=rid, data={"server": server.name}) from None
        raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} ended its stream without an answer",
                       status=502, id=rid, data={"server": server.name})

    async def listen(self, server: McpServer, session_id: str, protocol_version: str | None
                     ) -> AsyncIterator[dict[str, Any]]:
        """The server's own GET stream for our upstream session (server-initiated messages), until it
        ends; nothing when the server offers none (405)."""
        headers = self._headers(server, session_id, protocol_version)
        headers["Accept"] = "text/event-stream"
        async with self._client().get(server.endpoint, headers=headers,
                                      timeout=aiohttp.ClientTimeout(total=None, sock_read=None)) as r:
            if r.status != 200 or not r.headers.get("Content-Type", "").lower().startswith("text/event-stream"):
                return
            async for payload in _events(r):
                doc = _json(payload)
                if isinstance(doc, dict) and doc.get("jsonrpc") == "2.0":
                    yield doc

    def _headers(self, server: McpServer, session_id: str | None, protocol_version: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": _ACCEPT, **upstream_headers(server)}
        if session_id:
            headers[SESSION_HEADER] = session_id
        if protocol_version:
            headers[VERSION_HEADER] = protocol_version
        return headers

    async def delete(self, server: McpServer, session_id: str) -> None:
        """End an upstream session (best effort: the server may be gone)."""
        try:
            async with asyncio.timeout(min(server.timeout_s, 5.0)):
                async with self._client().delete(server.endpoint, headers={
                        SESSION_HEADER: session_id, **upstream_headers(server)}):
                    pass
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()


async def _read(server: McpServer, r: aiohttp.ClientResponse, expect: Any, session_id: str | None,
                rid: RequestId | None) -> Answer:
    answer = Answer(session_id=r.headers.get(SESSION_HEADER) or session_id)
    if r.status == 404 and session_id:
        raise SessionLost(server.name)
    if r.status == 202:
        return answer
    ctype = r.headers.get("Content-Type", "").lower()
    if ctype.startswith("text/event-stream"):
        async for payload in _events(r):
            answer.body_bytes += len(payload)
            doc = _json(payload)
            if not isinstance(doc, dict):
                continue
            if doc.get("jsonrpc") != "2.0":
                continue
            if "method" in doc and "id" not in doc:
                answer.notifications.append(doc)
            elif doc.get("id") == expect and ("result" in doc or "error" in doc):
                answer.response = doc
                await _drain(r)
                return answer
        if expect is not None:
            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} ended its stream without an answer",
                           status=502, id=rid, data={"server": server.name})
        return answer
    body = await r.read()
    answer.body_bytes = len(body)
    doc = _json(body) if body else None
    if isinstance(doc, dict) and doc.get("jsonrpc") == "2.0" and ("result" in doc or "error" in doc):
        answer.response = doc  # a JSON-RPC error keeps its own code, whatever the HTTP status
        return answer
    if r.status >= 400 or expect is not None:
        raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} answered HTTP {r.status} without a JSON-RPC reply",
                       status=502, id=rid, data={"server": server.name, "upstream_status": r.status})
    return answer


async def _drain(r: aiohttp.ClientResponse) -> None:
    """Read a stream's end (servers close it after the response): a connection read to its end goes
    back to the pool, one left half-read is closed and the next call pays a new connect."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with asyncio.timeout(_DRAIN_S):
            while await r.content.readany():
                pass


async def _events(r: aiohttp.ClientResponse) -> Any:
    """The `data` of each server-sent event (multi-line data joined with newlines)."""
    data: list[bytes] = []
    async for raw in r.content:
        line = raw.rstrip(b"\r\n")
        if not line:
            if data:
                yield b"\n".join(data)
                data = []
        elif line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    if data:
        yield b"\n".join(data)


def _json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
