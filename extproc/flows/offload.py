"""Work over a request body, kept off the event loop when the body is large."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# Bodies past this are parsed in a worker thread so the event loop keeps serving other streams;
# the parsers bound depth and value counts before building anything (docs/security.md).
INLINE_PARSE_BYTES = 64 * 1024


async def sized(work: Callable[[], T], nbytes: int) -> T:
    """`work()` inline for a small body, in a worker thread for a large one."""
    return work() if nbytes <= INLINE_PARSE_BYTES else await asyncio.to_thread(work)
