"""Stopping a part that polls or watches in the background: its tasks end, then its HTTP session closes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import aiohttp


async def stop_polling(tasks: Iterable[asyncio.Task[None]], session: aiohttp.ClientSession | None) -> None:
    """Cancel every task and wait until each has ended (its error, if any, is moot now), then close the
    session they shared."""
    running = list(tasks)
    for t in running:
        t.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    if session is not None:
        await session.close()
