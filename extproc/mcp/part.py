"""The Gateway's MCP part: `/mcp` answered by the extproc itself (docs/mcp.md says why).

initialize, the merged lists and ping are the gateway's own answers, made from a fan-out to the
servers the caller may reach (concurrent async HTTP, never blocking the event loop); a tools/call,
prompts/get or resources/read goes to the one server that owns the name, de-prefixed, in the
client's session's upstream session, with the server's credentials. A tools/call the client takes
as SSE, and GET /mcp, are authorised here and then carried by Envoy to this process's stream relay
(relay.py: progress as it happens, event ids, Last-Event-ID resumption); a JSON-only client gets
the answer as JSON (or SSE with the notifications before it), made here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from adapters.mcp.jsonrpc import (
    GATEWAY_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    SESSION_ERROR,
    Message,
    RpcError,
    error_body,
    parse_message,
    result_body,
    sse_event,
)
from adapters.mcp.merge import LISTS, merge_lists
from adapters.mcp.names import split_name
from contracts.config import GatewayConfig
from contracts.config.mcp import McpServer, longest_call_s
from contracts.envoy_names import (
    CLUSTER_HEADER,
    MCP_RELAY_CLUSTER,
    MCP_RELAY_HEADER,
    MCP_TICKET_HEADER,
    UPSTREAM_TIMEOUT_HEADER,
)
from contracts.keys import Caller
from extproc.admission.auth import Identity
from extproc.guard_tools import StreamGuard, guarded_tool_call, stream_guard
from extproc.mcp import metrics
from extproc.mcp.events import EventStore, MemoryEvents, RedisEvents, SqliteEvents, parse_event_id
from extproc.mcp.oauth import TokenVerifier
from extproc.mcp.policy import McpPolicy, ToolCaller
from extproc.mcp.relay import Emit, Job, McpRelay
from extproc.mcp.sessions import (
    McpSession,
    MemorySessions,
    RedisSessions,
    SessionStore,
    SessionStoreDown,
    SqliteSessions,
)
from extproc.mcp.upstream import Answer, SessionLost, UpstreamClient
from extproc.telemetry.audit import AuditEvent

if TYPE_CHECKING:
    from extproc.admission.auth import KeyRing
    from extproc.context import RequestContext
    from extproc.telemetry.audit import AuditLog
    from ratelimit import Limiter

log = logging.getLogger("modelyard.mcp")

SUPPORTED_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
LATEST_VERSION = SUPPORTED_VERSIONS[-1]
MCP_CALL = "mcp_call"  # the audit event of one tool call
_MAX_PAGES = 20
_CLOSING: set[asyncio.Task[None]] = set()  # old verifiers closing after a reload (kept from the GC)
_JSON = ("content-type", "application/json")


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...] = (_JSON,)


@dataclass(frozen=True, slots=True)
class Relayed:
    """Not answered here: Envoy carries the request on to this extproc's stream relay with these
    request headers (the relay cluster, its address, the job's ticket)."""

    headers: tuple[tuple[str, str], ...]


def build_store(config: GatewayConfig) -> SessionStore:
    m = config.mcp
    if m.sessions == "redis":
        return RedisSessions(config.ratelimit.redis.url, m.session_ttl_s)
    if m.sessions == "sqlite":
        return SqliteSessions(m.sqlite_path, m.session_ttl_s)
    return MemorySessions(m.session_ttl_s)


def build_events(config: GatewayConfig) -> EventStore:
    m = config.mcp
    if m.sessions == "redis":
        return RedisEvents(config.ratelimit.redis.url, m.event_ttl_s)
    if m.sessions == "sqlite":
        return SqliteEvents(m.sqlite_path, m.event_ttl_s)
    return MemoryEvents(m.event_ttl_s)


def relay_host(config: GatewayConfig) -> str | None:
    """The address Envoy dials for the relay; None: the extproc binds every interface (a container),
    so the relay does too and names this host's own address (its hostname's, as a pod's resolves)."""
    if config.mcp.relay_host:
        return config.mcp.relay_host
    host = config.extproc.address.rpartition(":")[0].strip("[]")
    return None if host in ("", "0.0.0.0", "::") else host


class McpHub:
    def __init__(self, config: GatewayConfig, *, store: SessionStore | None = None,
                 client: UpstreamClient | None = None, relay: McpRelay | None = None,
                 oauth: TokenVerifier | None = None) -> None:
        self.policy = McpPolicy(config.mcp_servers, config.mcp)
        self.longest_call_s = longest_call_s(config.mcp_servers)
        self.store = store if store is not None else build_store(config)
        self.client = client if client is not None else UpstreamClient()
        self.relay = relay if relay is not None else McpRelay(relay_host(config), build_events(config))
        settings = config.mcp.oauth
        # A reload keeps the verifier (its cached keys and poller) while its settings stay.
        self.oauth = oauth if oauth is not None and settings is not None and oauth.settings == settings else \
            TokenVerifier(settings) if settings is not None else None

    @classmethod
    def from_config(cls, config: GatewayConfig) -> McpHub | None:
        return cls(config) if config.mcp_servers else None

    def reconfigured(self, config: GatewayConfig) -> McpHub | None:
        """A reload: the new servers and rules; the sessions and the connections stay."""
        if not config.mcp_servers:
            return None
        hub = McpHub(config, store=self.store, client=self.client, relay=self.relay, oauth=self.oauth)
        if self.oauth is not None and hub.oauth is not self.oauth:
            with contextlib.suppress(RuntimeError):  # settings changed: the old poller stops
                task = asyncio.get_running_loop().create_task(self.oauth.close())
                _CLOSING.add(task)
                task.add_done_callback(_CLOSING.discard)
        return hub

    async def close(self) -> None:
        if self.oauth is not None:
            await self.oauth.close()
        await self.relay.close()
        await self.relay.events.close()
        await self.client.close()
        await self.store.close()

    # -- who calls -----------------------------------------------------------------------------------

    def _caller(self, ctx: RequestContext) -> ToolCaller:
        key_id = ctx.caller.key_id if ctx.caller else None
        tools = self.oauth.tools_of(key_id) if self.oauth is not None else None
        return ToolCaller(ctx.tenant_name, ctx.key_digest, key_id, tools)

    def challenge(self) -> list[tuple[str, str]]:
        """The 401's `WWW-Authenticate` when OAuth is on: where the resource metadata is."""
        return [self.oauth.challenge()] if self.oauth is not None else []

    async def bearer_identity(self, token: str, keyring: KeyRing) -> tuple[Identity, str]:
        """A bearer JWT's identity (its tenant, the grant's client and subject as the key id) and the
        digest that owns its sessions: the subject's, so a refreshed token keeps its session."""
        assert self.oauth is not None
        grant = await self.oauth.verify(token)
        named = keyring.identity_named(grant.tenant)
        if named is None:
            raise self.oauth.refused(403, "insufficient_scope", "the token's tenant is not configured")
        digest = hashlib.sha256(f"{self.oauth.settings.issuer}\0{grant.key_id}".encode()).hexdigest()
        return Identity(named.tenant, Caller(grant.tenant, grant.key_id)), digest

    # -- one POST ------------------------------------------------------------------------------------

    async def handle(self, ctx: RequestContext, body: bytes, limiter: Limiter | None,
                     audit: AuditLog | None) -> Reply | Relayed:
        rid = None
        try:
            msg = parse_message(body)
            rid = msg.id
            version = ctx.headers.get("mcp-protocol-version")
            if version and version not in SUPPORTED_VERSIONS:
                raise RpcError(INVALID_REQUEST, f"Bad Request: unsupported MCP-Protocol-Version {version[:40]!r}",
                               status=400, id=rid)
            who = self._caller(ctx)
            if msg.is_response:
                return Reply(202, b"", ())  # the gateway asks clients nothing: an answer has no taker
            if msg.method == "initialize":
                if not msg.is_request:
                    raise RpcError(INVALID_REQUEST, "Invalid Request: initialize needs an id", status=400)
                return await self._initialize(who, msg)
            session = await self._session(who, ctx.headers.get("mcp-session-id"), rid)
            if not msg.is_request:
                return Reply(202, b"", ())  # initialized, cancelled, roots/list_changed: nothing to forward
            return await self._request(ctx, who, session, msg, limiter, audit)
        except SessionStoreDown as e:
            log.warning("mcp session store: %s", e)
            down = RpcError(GATEWAY_ERROR, "the MCP session store cannot be reached; retry shortly", status=503, id=rid)
            return Reply(503, error_body(down), (_JSON, ("retry-after", "1")))
        except RpcError as e:
            if e.id is None:
                e.id = rid
            headers: tuple[tuple[str, str], ...] = (_JSON,)
            if e.status == 429 and e.data is not None:
                headers = (_JSON, ("retry-after", str(e.data.get("retry_after_s", 1))))
            return Reply(e.status, error_body(e), headers)

    async def _session(self, who: ToolCaller, sid: str | None, rid: Any) -> McpSession:
        if not sid:
            raise RpcError(INVALID_REQUEST, "Bad Request: the Mcp-Session-Id header is required after initialize",
                           status=400, id=rid)
        session = await self.store.get(sid[:64])
        # Another tenant's or key's session answers as an unknown one: ids are never confirmed.
        if session is None or session.tenant != who.tenant or session.key != who.key:
            raise RpcError(SESSION_ERROR, "Session not found", status=404, id=rid)
        return session

    async def _request(self, ctx: RequestContext, who: ToolCaller, session: McpSession, msg: Message,
                       limiter: Limiter | None, audit: AuditLog | None) -> Reply | Relayed:
        if msg.method == "ping":
            return Reply(200, result_body(msg.id, {}))
        if msg.method in LISTS:
            return Reply(200, result_body(msg.id, await self._list(who, session, msg)))
        if msg.method == "tools/call":
            return await self._call_tool(ctx, who, session, msg, limiter, audit)
        if msg.method == "prompts/get":
            return await self._prompt(ctx, who, session, msg)
        if msg.method == "resources/read":
            return await self._read(ctx, who, session, msg)
        if msg.method == "logging/setLevel":
            return Reply(200, result_body(msg.id, {}))
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {msg.method[:80]}", id=msg.id)

    # -- initialize and the lists --------------------------------------------------------------------

    async def _initialize(self, who: ToolCaller, msg: Message) -> Reply:
        asked = msg.params.get("protocolVersion")
        version = asked if isinstance(asked, str) and asked in SUPPORTED_VERSIONS else LATEST_VERSION
        session = McpSession(uuid.uuid4().hex, who.tenant, who.key, version)
        servers = self.policy.servers_for(who)
        # A server down now is left out; the first call that needs it opens its session then.
        await asyncio.gather(*(self._open(s, session) for s in servers), return_exceptions=True)
        await self.store.put(session)
        names = ", ".join(s.name for s in servers) or "none"
        result = {
            "protocolVersion": version,
            "capabilities": {"tools": {"listChanged": False}, "prompts": {"listChanged": False},
                             "resources": {"subscribe": False, "listChanged": False}, "logging": {}},
            "serverInfo": {"name": "modelyard", "title": "Modelyard MCP gateway", "version": "1"},
            "instructions": f"Tools, prompts and resources of these MCP servers, named <server>__<name>: {names}.",
        }
        return Reply(200, result_body(msg.id, result), (_JSON, ("mcp-session-id", session.id)))

    async def _open(self, server: McpServer, session: McpSession) -> None:
        """Initialise our upstream session with `server` (the gateway is its client)."""
        init = {"jsonrpc": "2.0", "id": "modelyard-init", "method": "initialize",
                "params": {"protocolVersion": session.protocol_version, "capabilities": {},
                           "clientInfo": {"name": "modelyard-gateway", "version": "1"}}}
        answer = await self._send(server, init, None, session.protocol_version, "initialize")
        result = (answer.response or {}).get("result")
        if not isinstance(result, dict):
            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} refused initialize", status=502,
                           data={"server": server.name})
        version = result.get("protocolVersion") if isinstance(result.get("protocolVersion"), str) else None
        sid, agreed = answer.session_id or "", version or session.protocol_version
        await self._send(server, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid or None, agreed,
                         "notifications/initialized")
        session.upstream[server.name] = (sid, agreed)

    async def _send(self, server: McpServer, message: dict[str, Any], sid: str | None, version: str | None,
                    method: str, rid: Any = None) -> Answer:
        try:
            answer = await self.client.send(server, message, session_id=sid, protocol_version=version, rid=rid)
        except RpcError as e:
            metrics.UPSTREAM.labels(server.name, method, str(e.status)).inc()
            raise
        metrics.UPSTREAM.labels(server.name, method, "200").inc()
        return answer

    async def _upstream(self, server: McpServer, session: McpSession, message: dict[str, Any], rid: Any) -> Answer:
        """`message` in the session's upstream session with `server`: opened when missing, opened again
        (once) when the server lost it."""
        method = str(message.get("method", ""))
        for attempt in (0, 1):
            if server.name not in session.upstream:
                await self._open(server, session)
                await self.store.put(session)
            sid, version = session.upstream[server.name]
            try:
                return await self._send(server, message, sid or None, version, method, rid)
            except SessionLost:
                del session.upstream[server.name]
                if attempt:
                    break
        raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} lost the session twice", status=502, id=rid)

    async def _list(self, who: ToolCaller, session: McpSession, msg: Message) -> dict[str, Any]:
        servers = self.policy.servers_for(who)
        found = await asyncio.gather(*(self._list_one(s, session, msg) for s in servers), return_exceptions=True)
        answers: list[tuple[str, list[Any]]] = []
        for server, got in zip(servers, found, strict=True):
            if isinstance(got, BaseException):
                log.warning("mcp %s on %s failed: %s", msg.method, server.name, got)
                continue
            answers.append((server.name, got))
        if servers and not answers:
            raise RpcError(GATEWAY_ERROR, "no MCP server answered", status=502, id=msg.id)
        if msg.method == "tools/list":
            return merge_lists(msg.method, answers, lambda _server, name: self.policy.visible(who, name))
        return merge_lists(msg.method, answers, lambda _server, _name: True)

    async def _list_one(self, server: McpServer, session: McpSession, msg: Message) -> list[Any]:
        key = LISTS[msg.method]
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(_MAX_PAGES):
            params = {"cursor": cursor} if cursor else {}
            answer = await self._upstream(server, session, {"jsonrpc": "2.0", "id": msg.id, "method": msg.method,
                                                            "params": params}, msg.id)
            response = answer.response or {}
            result = response.get("result")
            if not isinstance(result, dict):
                return items  # a server without prompts or resources answers Method not found
            page = result.get(key)
            items.extend(page if isinstance(page, list) else [])
            cursor = result.get("nextCursor") if isinstance(result.get("nextCursor"), str) else None
            if not cursor:
                break
        return items

    # -- calls to one server -------------------------------------------------------------------------

    async def _call_tool(self, ctx: RequestContext, who: ToolCaller, session: McpSession, msg: Message,
                         limiter: Limiter | None, audit: AuditLog | None) -> Reply | Relayed:
        name = msg.params.get("name")
        if not isinstance(name, str) or not name:
            raise RpcError(INVALID_PARAMS, 'Invalid params: tools/call needs a "name"', id=msg.id)
        owner = split_name(name)
        # A tool the caller may not call is refused exactly as an unknown one is.
        if owner is None or not self.policy.visible(who, name):
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name[:128]}", id=msg.id)
        server = self.policy.servers[owner[0]]
        started = time.monotonic()
        args = msg.params.get("arguments")
        arg_json = orjson.dumps(args) if args is not None else b""
        status, outcome, result_bytes, result_json = 200, "ok", 0, b""
        relayed = False
        try:
            charges = self.policy.charges(who, server.name, name)
            if limiter is not None and charges:
                d = await limiter.acquire_charges(charges)
                if not d.allowed:
                    retry = max(1, round(d.retry_after_s + 0.5))
                    raise RpcError(GATEWAY_ERROR, f"rate limit reached for {name[:128]}; retry in {retry}s",
                                   status=429, id=msg.id, data={"retry_after_s": retry, "limited_by": d.limited_by})
            forward = {"jsonrpc": "2.0", "id": msg.id, "method": "tools/call", "params": {**msg.params, "name": owner[1]}}
            if "text/event-stream" in ctx.headers.get("accept", ""):
                # Streamed: progress reaches the client as it happens; the relay audits at the end.
                # Guardrails: the arguments here (a block is this step's answer), the result in the relay.
                guard = stream_guard(ctx, name)
                if guard is not None:
                    forward = await guard.arguments(forward)
                if server.name not in session.upstream:
                    await self._open(server, session)
                    await self.store.put(session)
                relayed = True
                return await self._relayed_call(ctx, who, session, server, msg, forward, started, arg_json, audit,
                                                guard)
            # Guardrails on the call's arguments and result (docs/guardrails.md "MCP tools").
            answer = await guarded_tool_call(ctx, name, forward, lambda f: self._upstream(server, session, f, msg.id))
            result_bytes = answer.body_bytes
            response = answer.response or {}
            result = response.get("result")
            outcome = "tool_error" if isinstance(result, dict) and result.get("isError") else \
                "rpc_error" if "error" in response else "ok"
            if audit is not None and audit.capture_limit(ctx.tenant_name):
                result_json = orjson.dumps(result if result is not None else response.get("error"))
            return _relay(ctx, answer)
        except RpcError as e:
            status, outcome = e.status, "refused" if e.status == 429 else "error"
            raise
        finally:
            if not relayed:
                _record_call(ctx, who, session, server, name, started, status, outcome, arg_json, result_bytes,
                             result_json, audit)

    async def _relayed_call(self, ctx: RequestContext, who: ToolCaller, session: McpSession, server: McpServer,
                            msg: Message, forward: dict[str, Any], started: float, arg_json: bytes,
                            audit: AuditLog | None, guard: StreamGuard | None) -> Relayed:
        """A tools/call answered as it happens by the stream relay: every server message (progress)
        goes to the client as it arrives; the audit row and metrics when the call ends."""
        name = str(msg.params.get("name"))

        async def pump(emit: Emit) -> None:
            status, outcome, result_bytes, result_json = 200, "ok", 0, b""
            recorded = False

            def record() -> None:  # before the answer goes out: a client's next call sees this one's row
                nonlocal recorded
                if not recorded:
                    recorded = True
                    _record_call(ctx, who, session, server, name, started, status, outcome, arg_json, result_bytes,
                                 result_json, audit)

            try:
                for attempt in (0, 1):
                    if server.name not in session.upstream:
                        await self._open(server, session)
                        await self.store.put(session)
                    sid, version = session.upstream[server.name]
                    try:
                        async with asyncio.timeout(server.timeout_s):
                            async for doc in self.client.stream(server, forward, session_id=sid or None,
                                                                protocol_version=version, rid=msg.id):
                                result_bytes += len(orjson.dumps(doc))
                                if "method" not in doc and guard is not None:  # the result's output checks
                                    doc = await guard.result(doc)
                                if "method" not in doc:  # the response: the last message
                                    result = doc.get("result")
                                    outcome = "tool_error" if isinstance(result, dict) and result.get("isError") \
                                        else "rpc_error" if "error" in doc else "ok"
                                    if audit is not None and audit.capture_limit(ctx.tenant_name):
                                        result_json = orjson.dumps(result if result is not None else doc.get("error"))
                                    record()
                                await emit(doc)
                        metrics.UPSTREAM.labels(server.name, "tools/call", "200").inc()
                        return
                    except SessionLost:
                        del session.upstream[server.name]
                        if attempt:
                            raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} lost the session twice",
                                           status=502, id=msg.id) from None
                    except TimeoutError:
                        raise RpcError(GATEWAY_ERROR, f"MCP server {server.name} did not answer within "
                                       f"{server.timeout_s:g}s", status=504, id=msg.id,
                                       data={"server": server.name}) from None
            except RpcError as e:
                # Headers (200) are out: the failure is the JSON-RPC error for the call's id, on the stream.
                metrics.UPSTREAM.labels(server.name, "tools/call", str(e.status)).inc()
                status, outcome = e.status, "error"
                if e.id is None:
                    e.id = msg.id
                record()
                await emit(orjson.loads(error_body(e)))
            finally:
                record()

        job = Job("call", session.id, rid=msg.id, pump=pump, deadline=time.time() + server.timeout_s + 30,
                  prime=session.protocol_version >= "2025-11-25")
        return await self._relay_to(job, server.timeout_s + 5)

    async def _relay_to(self, job: Job, timeout_s: float | None) -> Relayed:
        address = await self.relay.address()
        # An SSE stream is never retried (a call is not idempotent; a ticket serves once).
        headers = [(CLUSTER_HEADER, MCP_RELAY_CLUSTER), (MCP_RELAY_HEADER, address),
                   (MCP_TICKET_HEADER, self.relay.issue(job)), ("x-envoy-max-retries", "0")]
        if timeout_s is not None:
            headers.append((UPSTREAM_TIMEOUT_HEADER, str(int(timeout_s * 1000))))
        else:
            headers.append((UPSTREAM_TIMEOUT_HEADER, "0"))  # a GET stream: open-ended (keepalives hold it)
        return Relayed(tuple(headers))

    # -- GET /mcp: the session's stream, or a resumed one --------------------------------------------

    async def listen(self, ctx: RequestContext) -> Reply | Relayed:
        """`GET /mcp`: the session's stream of server-initiated messages (each server's own GET
        stream, merged), or with `Last-Event-ID` the resumption of a stream this session lost."""
        who = self._caller(ctx)
        try:
            accept = ctx.headers.get("accept", "*/*")
            if "text/event-stream" not in accept and "*/*" not in accept:
                raise RpcError(INVALID_REQUEST, "Not Acceptable: GET /mcp answers text/event-stream", status=406)
            session = await self._session(who, ctx.headers.get("mcp-session-id"), None)
            last = ctx.headers.get("last-event-id")
            servers = [s for s in self.policy.servers_for(who) if s.name in session.upstream]

            async def pump(emit: Emit) -> None:
                await asyncio.gather(*(self._listen_one(s, session, emit) for s in servers))

            if last is not None:
                found = parse_event_id(last)
                if found is None:
                    raise RpcError(INVALID_REQUEST, "Bad Request: Last-Event-ID is not an event id of this gateway",
                                   status=400)
                return await self._relay_to(Job("resume", session.id, pump=pump, stream=found[0], after=found[1]),
                                            None)
            return await self._relay_to(Job("listen", session.id, pump=pump,
                                            prime=session.protocol_version >= "2025-11-25"), None)
        except SessionStoreDown:
            down = RpcError(GATEWAY_ERROR, "the MCP session store cannot be reached; retry shortly", status=503)
            return Reply(503, error_body(down), (_JSON, ("retry-after", "1")))
        except RpcError as e:
            return Reply(e.status, error_body(e))

    async def _listen_one(self, server: McpServer, session: McpSession, emit: Emit) -> None:
        sid, version = session.upstream[server.name]
        if not sid:
            return  # a stateless server has no stream of its own
        while True:
            try:
                async for doc in self.client.listen(server, sid, version):
                    if "method" in doc and "id" not in doc:  # notifications; the gateway answers no server requests
                        params = doc.get("params")
                        meta = {**(params.get("_meta") or {}), "modelyard/server": server.name} \
                            if isinstance(params, dict) else {"modelyard/server": server.name}
                        await emit({**doc, "params": {**(params if isinstance(params, dict) else {}), "_meta": meta}})
                return
            except (OSError, ValueError) as e:
                log.info("mcp GET stream of %s ended: %s", server.name, e)
                await asyncio.sleep(1.0)
            except Exception as e:  # aiohttp's errors: the server restarted; listen again shortly
                log.info("mcp GET stream of %s ended: %s", server.name, type(e).__name__)
                await asyncio.sleep(1.0)

    async def _prompt(self, ctx: RequestContext, who: ToolCaller, session: McpSession, msg: Message) -> Reply:
        name = msg.params.get("name")
        owner = split_name(name) if isinstance(name, str) else None
        server = self.policy.servers.get(owner[0]) if owner else None
        if owner is None or server is None or server not in self.policy.servers_for(who):
            raise RpcError(INVALID_PARAMS, f"Unknown prompt: {str(name)[:128]}", id=msg.id)
        forward = {"jsonrpc": "2.0", "id": msg.id, "method": msg.method, "params": {**msg.params, "name": owner[1]}}
        return _relay(ctx, await self._upstream(server, session, forward, msg.id))

    async def _read(self, ctx: RequestContext, who: ToolCaller, session: McpSession, msg: Message) -> Reply:
        uri = msg.params.get("uri")
        if not isinstance(uri, str):
            raise RpcError(INVALID_PARAMS, 'Invalid params: resources/read needs a "uri"', id=msg.id)
        listing = await self._list(who, session, Message("resources/list", msg.id, {}))
        owner = next((r["_meta"]["modelyard/server"] for r in listing["resources"] if r.get("uri") == uri), None)
        if owner is None:
            raise RpcError(-32002, f"Resource not found: {uri[:200]}", id=msg.id)
        forward = {"jsonrpc": "2.0", "id": msg.id, "method": msg.method, "params": msg.params}
        return _relay(ctx, await self._upstream(self.policy.servers[owner], session, forward, msg.id))

    # -- DELETE /mcp -----------------------------------------------------------------------------------

    async def end_session(self, ctx: RequestContext) -> Reply:
        who = self._caller(ctx)
        try:
            session = await self._session(who, ctx.headers.get("mcp-session-id"), None)
            await self.store.delete(session.id)
        except RpcError as e:
            return Reply(e.status, error_body(e))
        except SessionStoreDown:
            down = RpcError(GATEWAY_ERROR, "the MCP session store cannot be reached; retry shortly", status=503)
            return Reply(503, error_body(down), (_JSON, ("retry-after", "1")))
        for name, (sid, _version) in session.upstream.items():
            server = self.policy.servers.get(name)
            if server is not None and sid:
                await self.client.delete(server, sid)
        return Reply(200, b"", ())


def _record_call(ctx: RequestContext, who: ToolCaller, session: McpSession, server: McpServer, name: str,
                 started: float, status: int, outcome: str, arg_json: bytes, result_bytes: int, result_json: bytes,
                 audit: AuditLog | None) -> None:
    """A call's metrics and its `mcp_call` audit row."""
    tool = name.split("__", 1)[1] if "__" in name else name
    elapsed = time.monotonic() - started
    metrics.CALLS.labels(server.name, tool, outcome).inc()
    metrics.LATENCY.labels(server.name, tool).observe(elapsed)
    if audit is not None:
        # Argument and result bodies only for a tenant that captures bodies: capped and redacted
        # by the audit writer under the tenant's rules, as model bodies are.
        cap = audit.capture_limit(ctx.tenant_name)
        audit.record(AuditEvent(
            event=MCP_CALL, time=time.time(), task_id=ctx.task_id, tenant=ctx.tenant_name,
            key_id=who.key_id or who.key[:12], client=ctx.client, method="tools/call", path=ctx.path,
            model=name, cluster=server.name, status=status,
            detail={"server": server.name, "tool": tool, "outcome": outcome,
                    "latency_ms": round(elapsed * 1000, 3), "argument_bytes": len(arg_json),
                    "result_bytes": result_bytes, "session": session.id[:8],
                    # The guardrail verdicts as the chat flow's rows carry them (policy, check, action, direction).
                    **({"guardrails": ctx.guardrail_verdicts} if ctx.guardrail_verdicts else {})},
            request_body=arg_json[:cap] if cap else None, request_size=len(arg_json),
            response_body=result_json[:cap] if cap else None, response_size=len(result_json)))


def _relay(ctx: RequestContext, answer: Answer) -> Reply:
    """The server's response, after its notifications when there were any (SSE, in order, when the
    client accepts it)."""
    body = orjson.dumps(answer.response)
    if not answer.notifications or "text/event-stream" not in ctx.headers.get("accept", ""):
        return Reply(200, body)
    events = b"".join(sse_event(orjson.dumps(n)) for n in answer.notifications) + sse_event(body)
    return Reply(200, events, (("content-type", "text/event-stream"), ("cache-control", "no-cache")))
