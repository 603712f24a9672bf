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

import orjson

from adapters.mcp.jsonrpc import INVALID_PARAMS, RpcError, error_body
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
    found = _guard(ctx, name)
    if found is None:
        return await call(forward)
    tg, guard = found
    try:
        answer = await call(await _arguments(tg, guard, ctx, name, forward))
        result = (answer.response or {}).get("result")
        if result is not None and guard.checks.outputs:
            checked = scan_json(guard, result, "output")
            if guard.checks.remote_outputs:
                await tg.hooks.check_text(guard, "output", json_text(checked), name, ctx.tenant_name, ctx.task_id,
                                          tg.config)
            if checked is not result:
                assert answer.response is not None
                answer.response = {**answer.response, "result": checked}
        return answer
    except GuardrailBlocked as e:
        raise _refusal(e, forward) from None
    finally:
        record(guard, ctx)


async def checked_arguments(ctx: RequestContext, name: str, forward: dict[str, Any]) -> dict[str, Any]:
    """Only the arguments' checks (a call whose result is not read here, a relayed stream's):
    the message to forward, redacted; RpcError for a block."""
    found = _guard(ctx, name)
    if found is None:
        return forward
    tg, guard = found
    try:
        return await _arguments(tg, guard, ctx, name, forward)
    except GuardrailBlocked as e:
        raise _refusal(e, forward) from None
    finally:
        record(guard, ctx)


@dataclass(slots=True)
class StreamGuard:
    """A relayed (streamed) tools/call's checks: its arguments in the ext_proc step, its result when the
    MCP relay has it, in another task (no TOOL_GUARD there: the guard travels with the call)."""

    tg: ToolGuard
    guard: CallGuard
    ctx: RequestContext
    name: str

    async def arguments(self, forward: dict[str, Any]) -> dict[str, Any]:
        try:
            return await _arguments(self.tg, self.guard, self.ctx, self.name, forward)
        except GuardrailBlocked as e:
            raise _refusal(e, forward) from None
        finally:
            record(self.guard, self.ctx)

    async def result(self, response: dict[str, Any]) -> dict[str, Any]:
        """The server's response with its result checked, or the JSON-RPC refusal for its id."""
        try:
            result = response.get("result")
            if result is None or not self.guard.checks.outputs:
                return response
            checked = scan_json(self.guard, result, "output")
            if self.guard.checks.remote_outputs:
                await self.tg.hooks.check_text(self.guard, "output", json_text(checked), self.name,
                                               self.ctx.tenant_name, self.ctx.task_id, self.tg.config)
            return response if checked is result else {**response, "result": checked}
        except GuardrailBlocked as e:
            return orjson.loads(error_body(_refusal(e, response)))
        finally:
            record(self.guard, self.ctx)


def stream_guard(ctx: RequestContext, name: str) -> StreamGuard | None:
    """The checks of a tools/call the MCP relay streams (None: no policy covers it)."""
    found = _guard(ctx, name)
    return StreamGuard(found[0], found[1], ctx, name) if found is not None else None


def _guard(ctx: RequestContext, name: str) -> tuple[ToolGuard, CallGuard] | None:
    tg = TOOL_GUARD.get()
    if tg is None:
        return None
    key_id = ctx.caller.key_id if ctx.caller is not None and ctx.caller.key_id else ""
    checks = tg.policies.for_tool(ctx.tenant_name, key_id, name)
    return (tg, CallGuard(checks)) if checks is not None else None


async def _arguments(tg: ToolGuard, guard: CallGuard, ctx: RequestContext, name: str,
                     forward: dict[str, Any]) -> dict[str, Any]:
    params = forward.get("params") or {}
    args = params.get("arguments")
    if args is None:
        return forward
    checked = scan_json(guard, args, "input")
    if guard.checks.remote_inputs:
        await tg.hooks.check_text(guard, "input", json_text(checked), name, ctx.tenant_name, ctx.task_id, tg.config)
    return forward if checked is args else {**forward, "params": {**params, "arguments": checked}}


def _refusal(e: GuardrailBlocked, forward: dict[str, Any]) -> RpcError:
    # A JSON-RPC error on a 200, as the MCP SDKs read a refused call (a 4xx is a transport failure to them).
    rid = forward.get("id")
    return RpcError(INVALID_PARAMS, e.message, id=rid if isinstance(rid, str | int) else None)
