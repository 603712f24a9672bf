"""An aiohttp app served on its own event loop in a thread: a stand-in upstream or receiver for
tests whose stack start-up blocks the test's own thread."""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from tests.stack_config import free_port


class ThreadedApp:
    def __init__(self, app: web.Application) -> None:
        self.port = free_port()
        self.runner = web.AppRunner(app)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ThreadedApp:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
