"""A same-protocol body keeps its bytes' every field: only its string values are rewritten, each
original text replaced by what the guard put in its place (a placeholder, or a restored original)."""

from __future__ import annotations

import re
from typing import Any

import orjson


def rewrite_json(body: bytes, table: dict[str, str]) -> bytes:
    """`body` (a JSON document) with every occurrence of a key of `table` in a string value replaced;
    the same bytes where nothing changed or the body is no JSON."""
    if not table:
        return body
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    pattern = re.compile("|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)))
    changed = False

    def walk(node: Any) -> Any:
        nonlocal changed
        if isinstance(node, str):
            new = pattern.sub(lambda m: table[m.group()], node)
            changed = changed or new != node
            return new
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(doc)
    return orjson.dumps(out) if changed else body
