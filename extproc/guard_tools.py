"""Guardrails on MCP tool calls (docs/guardrails.md "MCP tools"): a policy covering the caller (its
tenant or key) or the tool (`applies_to.tools`) checks a tools/call's arguments before the server gets
them and its result before the caller does; a block is a JSON-RPC error naming the policy.

The MCP part calls `guarded_tool_call` at one place (extproc/mcp/part.py, around the upstream call);
the gateway's policies reach it through `TOOL_GUARD`, set by the /mcp flow for the request's task."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from adapters.mcp.jsonrpc import INVALID_PARAMS, RpcError
from contracts.config import GatewayConfig
from extproc.context import RequestContext
from extproc.guard_hooks import GuardHooks, record
from guardrails import CallGuard, GuardrailBlocked, PolicySet
from guardrails.tools import json_text, scan_json


class _Answer(Protocol):  # extproc.mcp.upstream.Answer (not imported: the MCP part imports this module)
    response: dict[str, Any] | None


A = TypeVar("A", bound=_Answer)


@dataclass(frozen=True, slots=True)
class ToolGuard:
    policies: PolicySet
    hooks: GuardHooks
    config: GatewayConfig


TOOL_GUARD: ContextVar[ToolGuard | None] = ContextVar("modelyard_tool_guard", default=None)


async def guarded_tool_call(ctx: RequestContext, name: str, forward: dict[str, Any],
                            call: Callable[[dict[str, Any]], Awaitable[A]]) -> A:
    """`call(forward)` with the covering policies' checks on its arguments and its result."""
    tg = TOOL_GUARD.get()
    key_id = ctx.caller.key_id if ctx.caller is not None and ctx.caller.key_id else ""
    checks = tg.policies.for_tool(ctx.tenant_name, key_id, name) if tg is not None else None
    if tg is None or checks is None:
        return await call(forward)
    guard = CallGuard(checks)
    params = forward.get("params") or {}
    rid = forward.get("id")
    try:
        args = params.get("arguments")
        if args is not None:
            checked = scan_json(guard, args, "input")
            if checks.remote_inputs:
                await tg.hooks.check_text(guard, "input", json_text(checked), name, ctx.tenant_name, ctx.task_id,
                                          tg.config)
            if checked is not args:
                forward = {**forward, "params": {**params, "arguments": checked}}
        answer = await call(forward)
        result = (answer.response or {}).get("result")
        if result is not None and checks.outputs:
            checked = scan_json(guard, result, "output")
            if checks.remote_outputs:
                await tg.hooks.check_text(guard, "output", json_text(checked), name, ctx.tenant_name, ctx.task_id,
                                          tg.config)
            if checked is not result:
                assert answer.response is not None
                answer.response = {**answer.response, "result": checked}
        return answer
    except GuardrailBlocked as e:
        # A JSON-RPC error on a 200, as the MCP SDKs read a refused call (a 4xx is a transport failure to them).
        raise RpcError(INVALID_PARAMS, e.message, id=rid if isinstance(rid, str | int) else None) from None
    finally:
        record(guard, ctx)
