"""The chat flow's guardrails step (docs/guardrails.md): which checks cover this call, the verdicts
counted and kept for the audit row. The checks themselves are pure (`guardrails/`)."""

from __future__ import annotations

from adapters.internal import ChatRequest, ChatResponse, StreamEvent, TextDelta, ToolCallDelta
from extproc.context import RequestContext
from extproc.gateway import Gateway
from extproc.guard_hooks import record
from guardrails import CallGuard

__all__ = ["answer_text", "guard_for", "record", "released_text"]


def guard_for(gw: Gateway, ctx: RequestContext, req: ChatRequest) -> CallGuard | None:
    """A call's guard, or None (the common case: no policy covers it, nothing more is done)."""
    if not gw.guardrails:
        return None
    key_id = ctx.caller.key_id if ctx.caller is not None and ctx.caller.key_id else ""
    checks = gw.guardrails.for_call(ctx.tenant_name, key_id, req.model)
    return CallGuard(checks) if checks is not None else None


def answer_text(resp: ChatResponse) -> str:
    """What remote output checks are asked about: the answer's text, refusal and tool calls' arguments."""
    return "\n".join(t for t in (resp.content, resp.refusal or "", *(tc.arguments for tc in resp.tool_calls)) if t)


def released_text(events: list[StreamEvent]) -> str:
    """The text (and tool-call arguments) a stream guard released in `events`."""
    return "".join(e.text if isinstance(e, TextDelta) else e.arguments for e in events
                   if isinstance(e, TextDelta | ToolCallDelta))
