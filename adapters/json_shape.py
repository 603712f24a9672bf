"""The shape of a JSON text (nesting depth, containers, values) measured without parsing it.

Parsing builds one Python object per value while holding the GIL, so a body of a million tiny
values stalls every other request for seconds, and nesting past orjson's `dumps` limit (254)
parses but cannot be re-rendered. `measure` reads only the structural bytes outside strings,
vectorised over fixed-size chunks: memory stays small and the work is numpy's, not the
interpreter's. Invalid JSON gives some shape; the parser that follows rejects it anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

from contracts.errors import ClientError

MAX_JSON_DEPTH = 64  # far past any real request; well under orjson's dumps limit (254)
_CHUNK = 1 << 20

_QUOTE, _BACKSLASH, _COMMA = 0x22, 0x5C, 0x2C
_OPEN = (0x5B, 0x7B)  # [ {
_CLOSE = (0x5D, 0x7D)  # ] }


@dataclass(frozen=True, slots=True)
class JsonShape:
    depth: int  # deepest nesting of arrays and objects
    containers: int  # arrays and objects
    values: int  # containers + commas outside strings: an upper bound on array items and members


def measure(body: bytes | bytearray | memoryview, *, stop_depth: int | None = None,
            stop_values: int | None = None) -> JsonShape:
    """Depth and counts of the structural characters outside strings, in C-speed passes; stops
    at the first chunk past `stop_depth` or `stop_values` (an attack costs one chunk, not all)."""
    # NumPy on first use: typical bodies never get here (surely_within), so a demo upstream skips its import.
    import numpy as np

    data = np.frombuffer(body, dtype=np.uint8)
    in_string = 0  # 1 when the previous chunk ended inside a string
    bs_run = 0  # backslashes ending the previous chunk (an odd run escapes a quote)
    depth = max_depth = containers = commas = 0
    for start in range(0, len(data), _CHUNK):
        a = data[start:start + _CHUNK]
        n = len(a)
        is_bs = a == _BACKSLASH
        quotes = np.flatnonzero(a == _QUOTE)
        if is_bs.any():
            # For every position, the last index at or before it that is not a backslash.
            last_plain = np.maximum.accumulate(np.where(is_bs, -1, np.arange(n)))
            prev = quotes - 1
            lp = np.where(prev >= 0, last_plain[np.maximum(prev, 0)], -1)
            run = np.where(lp >= 0, prev - lp, prev + 1 + bs_run)
            quotes = quotes[run % 2 == 0]
            bs_run = int(n - 1 - last_plain[-1]) if last_plain[-1] >= 0 else n + bs_run
        else:
            bs_run = 0
        structural = np.flatnonzero((a == _OPEN[0]) | (a == _OPEN[1]) | (a == _CLOSE[0]) | (a == _CLOSE[1])
                                    | (a == _COMMA))
        outside = (np.searchsorted(quotes, structural) + in_string) % 2 == 0
        chars = a[structural[outside]]
        step = (chars == _OPEN[0]).astype(np.int64) + (chars == _OPEN[1]) - (chars == _CLOSE[0]) - (chars == _CLOSE[1])
        if len(step):
            path = np.cumsum(step) + depth
            max_depth = max(max_depth, int(path.max()))
            depth = int(path[-1])
        containers += int((step > 0).sum())
        commas += int((chars == _COMMA).sum())
        in_string = (in_string + len(quotes)) % 2
        if (stop_depth is not None and max_depth > stop_depth) or (
                stop_values is not None and containers + commas > stop_values):
            break
    return JsonShape(max_depth, containers, containers + commas)


def surely_within(body: bytes | bytearray | memoryview, *, max_values: int | None = None,
                  max_depth: int = MAX_JSON_DEPTH) -> bool:
    """True when plain byte counts already prove `check_shape` would pass: every bracket and
    comma counted, inside strings or not, bounds depth and values from above. A typical request
    body costs a few C-speed scans here instead of measure's two dozen numpy calls."""
    if isinstance(body, memoryview):
        return False
    opens = body.count(b"[") + body.count(b"{")
    return opens <= max_depth and (max_values is None or opens + body.count(b",") <= max_values)


def check_shape(body: bytes | bytearray | memoryview, *, max_values: int | None = None,
                max_depth: int = MAX_JSON_DEPTH, what: str = "request body") -> JsonShape:
    """Refuse nesting deeper than `max_depth` (400) or more than `max_values` values (413)."""
    shape = measure(body, stop_depth=max_depth, stop_values=max_values)
    if shape.depth > max_depth:
        raise ClientError(f"{what}: JSON nesting deeper than {max_depth} levels")
    if max_values is not None and shape.values > max_values:
        raise ClientError(f"{what}: more than {max_values} JSON values", status=413)
    return shape
