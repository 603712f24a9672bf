"""`/mcp` (MCP streamable HTTP): POST answered by the Gateway's MCP part, or (a tools/call taken as
SSE) carried on by Envoy to the extproc's stream relay; GET streams through the relay (the session's
server-initiated messages, or a stream resumed with Last-Event-ID); DELETE ends a session."""

from __future__ import annotations

import orjson
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

from contracts.envoy_names import WAIT_MARGIN_S
from contracts.errors import NotFound
from extproc import messages as msg
from extproc.context import Interim, RequestContext
from extproc.flows.body_answer import SelfAnswered
from extproc.gateway import Gateway
from extproc.guard_tools import TOOL_GUARD, ToolGuard
from extproc.mcp.oauth import WELL_KNOWN, metadata_paths
from extproc.mcp.part import McpHub, Relayed, Reply

PATHS = ("/mcp", "/mcp/")
METADATA_PREFIX = WELL_KNOWN


def _hub(gw: Gateway, ctx: RequestContext) -> McpHub:
    if gw.mcp is None:  # no mcp_servers: as any unknown URL
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return gw.mcp


def _reply(reply: Reply, ctx: RequestContext) -> msg.ProcessingResponse:
    return msg.immediate(reply.status, reply.body, [*reply.headers, *ctx.task_headers()])


async def end_session(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return _reply(await _hub(gw, ctx).end_session(ctx), ctx)


def resource_metadata(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """RFC 9728's Protected Resource Metadata: where a client gets a token for /mcp."""
    hub = gw.mcp
    if hub is None or hub.oauth is None or ctx.path not in metadata_paths(hub.oauth.settings.resource):
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return msg.immediate(200, orjson.dumps(hub.oauth.metadata()),
                         [("content-type", "application/json"), ("cache-control", "max-age=300")])


def not_allowed(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    _hub(gw, ctx)
    return msg.immediate(405, b"", [("allow", "GET, POST, DELETE"), *ctx.task_headers()])


async def listen(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    out = await _hub(gw, ctx).listen(ctx)
    if isinstance(out, Reply):
        return _reply(out, ctx)
    r = msg.request_headers(set_headers=out.headers, clear_route_cache=True)
    # The relay's stream goes to the client as it is written: no response step comes to us.
    r.mode_override.response_header_mode = processing_mode_pb2.ProcessingMode.SKIP
    r.mode_override.response_body_mode = processing_mode_pb2.ProcessingMode.NONE
    r.mode_override.response_trailer_mode = processing_mode_pb2.ProcessingMode.SKIP
    return r


class McpFlow(SelfAnswered):
    async def request_body(self, body: bytes) -> Interim:
        hub = _hub(self.gw, self.ctx)

        async def answer() -> msg.ProcessingResponse:
            if self.gw.guardrails:  # the policies for tools/call checks (extproc/guard_tools.py), this task only
                TOOL_GUARD.set(ToolGuard(self.gw.guardrails, self.gw.guard_hooks, self.gw.config))
            out = await hub.handle(self.ctx, body, self.gw.dispatcher.limiter, self.gw.audit)
            if isinstance(out, Relayed):
                return msg.request_body(set_headers=out.headers, clear_route_cache=True)
            return _reply(out, self.ctx)

        # A tool may run past Envoy's message timeout: ask for the longest server timeout first.
        return Interim(msg.extend_timeout(hub.longest_call_s + WAIT_MARGIN_S), answer)

    def response_headers(self, status: int, headers: dict[str, str]) -> msg.ProcessingResponse:
        # The relay's SSE: each event to the client as it is written, never buffered for us.
        r = msg.response_headers(skip_body=True)
        r.mode_override.response_trailer_mode = processing_mode_pb2.ProcessingMode.SKIP
        return r
