"""Callers see `<server>__<tool>`: clients restrict tool names to [a-zA-Z0-9_-]{1,64}, so `.` or `/`
would be refused; server names hold no `__` (contracts/config/mcp.py), so the first `__` splits."""

from __future__ import annotations

from contracts.config.mcp import SEPARATOR


def join_name(server: str, name: str) -> str:
    return f"{server}{SEPARATOR}{name}"


def split_name(name: str) -> tuple[str, str] | None:
    """(server, the server's own name), or None when `name` carries no server prefix."""
    server, sep, rest = name.partition(SEPARATOR)
    if not sep or not server or not rest:
        return None
    return server, rest
