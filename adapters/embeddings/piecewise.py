"""Large embeddings answers parsed and written one vector at a time.

`orjson.loads` of a 30 MB answer, or `orjson.dumps` of 3 million floats, is one C call that holds
the GIL throughout: run in a worker thread it still stalls the event loop for all of it. One call
per vector keeps each hold short, so the thread yields the GIL every few milliseconds (the
interpreter's switch interval) and the loop goes on serving other streams. The output is
byte-for-byte what one `orjson` call writes, and a body whose layout the split does not prove
(checked by parsing the rest of it, the "skeleton") is left to the whole-body parser.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import orjson

from adapters.json_types import JSONObject

if TYPE_CHECKING:  # NumPy loads on first use (wire.py says why)
    import numpy as np

__all__ = ["PIECEWISE_BYTES", "split_vectors", "json_with_array"]

# Below this a body is parsed whole: one call is short anyway.
PIECEWISE_BYTES = 256 * 1024
_WS = b" \t\r\n"


def _skip_ws(body: bytes, i: int) -> int:
    n = len(body)
    while i < n and body[i] in _WS:
        i += 1
    return i


def split_vectors(body: bytes, key: str) -> tuple[JSONObject, np.ndarray] | None:
    """(the body with every `key: [numbers]` array emptied, parsed; the arrays as float32 rows in
    document order), or None when the body is small or not laid out that way (parse it whole)."""
    if len(body) < PIECEWISE_BYTES:
        return None
    token = orjson.dumps(key)
    spans: list[tuple[int, int]] = []
    at = body.find(token)
    while at >= 0:
        colon = _skip_ws(body, at + len(token))
        if colon < len(body) and body[colon] == 0x3A:  # ':' after it: a key, not a string value
            lb = _skip_ws(body, colon + 1)
            if lb >= len(body) or body[lb] != 0x5B:  # '['
                return None
            rb = body.find(b"]", lb)
            if rb < 0:
                return None
            spans.append((lb, rb + 1))
            at = body.find(token, rb + 1)
        else:
            at = body.find(token, at + len(token))
    if not spans:
        return None
    import numpy as np

    rows: np.ndarray | None = None
    for i, (start, end) in enumerate(spans):
        try:
            row = orjson.loads(body[start:end])
        except orjson.JSONDecodeError:
            return None  # a nested array or a ']' in a string: the cut was not an array of numbers
        if rows is None:
            rows = np.empty((len(spans), len(row)), np.float32)
        if len(row) != rows.shape[1]:
            return None  # the whole-body parser names the mismatch
        try:
            rows[i] = row
        except (TypeError, ValueError):
            return None
    pieces: list[bytes] = []
    prev = 0
    for start, end in spans:
        pieces += (body[prev:start], b"[]")
        prev = end
    pieces.append(body[prev:])
    try:
        skeleton = orjson.loads(b"".join(pieces))
    except orjson.JSONDecodeError:
        return None
    if type(skeleton) is not dict or rows is None:
        return None
    return skeleton, rows


def json_with_array(head: bytes, items: Iterable[bytes], tail: bytes) -> bytes:
    """`head`, a JSON array of already-encoded items, `tail`: one copy of the bytes, not one per `+`."""
    pieces = [head, b"["]
    for item in items:
        pieces += (item, b",")
    if len(pieces) > 2:
        pieces.pop()
    pieces += (b"]", tail)
    return b"".join(pieces)
