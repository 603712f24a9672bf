"""`/mcp` (MCP streamable HTTP): POST answered by the Gateway's MCP part, DELETE ends a session,
GET is 405 (no server-initiated stream: the spec's answer for a server that offers none)."""

from __future__ import annotations

from contracts.envoy_names import WAIT_MARGIN_S
from contracts.errors import NotFound
from extproc import messages as msg
from extproc.context import Interim, RequestContext
from extproc.flows.body_answer import SelfAnswered
from extproc.gateway import Gateway
from extproc.guard_tools import TOOL_GUARD, ToolGuard
from extproc.mcp.part import McpHub, Reply

PATHS = ("/mcp", "/mcp/")


def _hub(gw: Gateway, ctx: RequestContext) -> McpHub:
    if gw.mcp is None:  # no mcp_servers: as any unknown URL
        raise NotFound(f"Unknown request URL: {ctx.method} {ctx.path}")
    return gw.mcp


def _reply(reply: Reply, ctx: RequestContext) -> msg.ProcessingResponse:
    return msg.immediate(reply.status, reply.body, [*reply.headers, *ctx.task_headers()])


async def end_session(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    return _reply(await _hub(gw, ctx).end_session(ctx), ctx)


def no_stream(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    _hub(gw, ctx)
    return msg.immediate(405, b"", [("allow", "POST, DELETE"), *ctx.task_headers()])


class McpFlow(SelfAnswered):
    async def request_body(self, body: bytes) -> Interim:
        hub = _hub(self.gw, self.ctx)

        async def answer() -> msg.ProcessingResponse:
            if self.gw.guardrails:  # the policies for tools/call checks (extproc/guard_tools.py), this task only
                TOOL_GUARD.set(ToolGuard(self.gw.guardrails, self.gw.guard_hooks, self.gw.config))
            return _reply(await hub.handle(self.ctx, body, self.gw.dispatcher.limiter, self.gw.audit), self.ctx)

        # A tool may run past Envoy's message timeout: ask for the longest server timeout first.
        return Interim(msg.extend_timeout(hub.longest_call_s + WAIT_MARGIN_S), answer)
