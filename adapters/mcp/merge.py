"""tools/list, prompts/list and resources/list of several servers as one list: every name
prefixed with its server's (collisions impossible), only what the caller may see."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from adapters.mcp.names import join_name

# The list methods the gateway aggregates, and the key of each one's items in a result.
LISTS = {"tools/list": "tools", "prompts/list": "prompts", "resources/list": "resources",
         "resources/templates/list": "resourceTemplates"}


def merge_lists(method: str, answers: Iterable[tuple[str, list[Any]]],
                visible: Callable[[str, str], bool]) -> dict[str, Any]:
    """One result for `method` from (server, items) pairs: names prefixed, items `visible(server,
    prefixed name)` refuses dropped; a resource keeps its URI (the server's own) and says whose it is."""
    out: list[Any] = []
    for server, items in answers:
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue  # not a well-formed item: nothing a client could call
            name = join_name(server, item["name"])
            if not visible(server, name):
                continue
            meta: dict[str, Any] = item["_meta"] if isinstance(item.get("_meta"), dict) else {}
            out.append({**item, "name": name, "_meta": {**meta, "modelyard/server": server}})
    return {LISTS[method]: out}
