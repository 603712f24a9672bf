"""A demo upstream's own SSE events rewritten on their way out (several choices, a search reported):
each event whose data is a JSON object becomes the events `rewrite` returns, the others pass as sent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from adapters.sse import SSEFramer, encode_event


def rewrite_events(data: bytes, rewrite: Callable[[dict[str, Any]], list[dict[str, Any]]]) -> bytes:
    """`data`: whole events, as one encoder call writes them."""
    framer = SSEFramer()
    out = []
    for ev in framer.feed(data) + framer.close():
        obj = orjson.loads(ev.data) if ev.data.startswith(b"{") else None
        out += [encode_event(orjson.dumps(o), ev.event) for o in rewrite(obj)] if isinstance(obj, dict) \
            else [encode_event(ev.data, ev.event)]
    return b"".join(out)
