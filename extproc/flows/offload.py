"""Work over a request or response body, kept off the event loop when the body is large."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Bodies past this are parsed, translated and encoded in a worker thread so the event loop keeps
# serving other streams (a 2048 x 1536 embeddings answer takes hundreds of ms to convert); below it
# the thread hand-off would cost more than the work. The parsers bound depth and value counts
# before building anything (docs/security.md).
INLINE_PARSE_BYTES = 64 * 1024


def inline(nbytes: int) -> bool:
    """A body this small is worked on in the event loop."""
    return nbytes <= INLINE_PARSE_BYTES


async def sized(work: Callable[[], T], nbytes: int) -> T:
    """`work()` inline for a small body, in a worker thread for a large one."""
    return work() if nbytes <= INLINE_PARSE_BYTES else await asyncio.to_thread(work)
