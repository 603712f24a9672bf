"""Checks on MCP tool calls, pure: every string of a call's `arguments` (input) or its `result`
(output) through a call's checks, JSON shape kept (keys are names, not content: left as they are)."""

from __future__ import annotations

from typing import Any

from guardrails.scan import CallGuard, Side

MAX_DEPTH = 64  # deeper JSON is not walked further (the MCP parser bounds what reaches here anyway)


def scan_json(guard: CallGuard, value: Any, side: Side, depth: int = 0) -> Any:
    """`value` with each string scanned (a block raises GuardrailBlocked; redactions placed; on
    output, this call's restorable placeholders put back); the same object when nothing changed."""
    if isinstance(value, str):
        out = guard.scan(value, side)
        return guard.vault.restore(out) if side == "output" else out
    if depth >= MAX_DEPTH:
        return value
    if isinstance(value, list):
        items = [scan_json(guard, v, side, depth + 1) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        new = {k: scan_json(guard, v, side, depth + 1) for k, v in value.items()}
        return value if all(new[k] is value[k] for k in value) else new
    return value


def json_text(value: Any, depth: int = 0) -> str:
    """The strings of `value`, one a line: what a remote check (webhook, moderation) reads."""
    if isinstance(value, str):
        return value
    if depth >= MAX_DEPTH:
        return ""
    if isinstance(value, list):
        return "\n".join(t for t in (json_text(v, depth + 1) for v in value) if t)
    if isinstance(value, dict):
        return "\n".join(t for t in (json_text(v, depth + 1) for v in value.values()) if t)
    return ""
