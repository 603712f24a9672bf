"""Fuzz helper shared by the adapter fuzz tests: one node of a JSON value replaced."""

from __future__ import annotations


def mutate(obj: object, path: list, value: object) -> object:
    """Replace the node at `path` (indices folded modulo container size) with `value`."""
    if not path or not isinstance(obj, (dict, list)) or not obj:
        return value
    if isinstance(obj, dict):
        k = sorted(obj)[path[0] % len(obj)]
        return {**obj, k: mutate(obj[k], path[1:], value)}
    i = path[0] % len(obj)
    return [*obj[:i], mutate(obj[i], path[1:], value), *obj[i + 1:]]
