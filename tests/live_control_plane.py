"""A minimal control plane for the extproc's side of contracts/live_config.py: it offers one config text
at a time on CONFIG_PATH (long-poll: 200 when the caller's `have` differs, else 304 after `wait_s`) and
records every ACK_PATH post. Runs on the test's event loop (`start`) or in a thread of its own (`thread`)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from contracts.live_config import ACK_PATH, CONFIG_PATH, config_version


class ControlPlane:
    def __init__(self, wait_s: float = 2.0, *, honour_have: bool = True) -> None:
        self.wait_s = wait_s
        self.honour_have = honour_have  # False: a careless server that answers 200 at once, every time
        self.text = b""
        self.acks: list[dict[str, Any]] = []
        self.polls: list[dict[str, str]] = []
        self.port = 0
        self._changed: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def offer(self, text: bytes) -> str:
        """Serve `text` from now on; its version. Callable from any thread."""
        self.text = text
        if self._loop is not None and self._changed is not None:
            self._loop.call_soon_threadsafe(self._changed.set)
        return config_version(text)

    def acks_for(self, version: str) -> list[dict[str, Any]]:
        return [a for a in list(self.acks) if a.get("version") == version]

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        app = web.Application()
        app.router.add_get(CONFIG_PATH, self._config)
        app.router.add_post(ACK_PATH, self._ack)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None and server.sockets  # type: ignore[attr-defined]
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @classmethod
    @contextmanager
    def thread(cls, wait_s: float = 2.0) -> Iterator[ControlPlane]:
        """One on a loop in a daemon thread, for tests whose extproc is another process."""
        cp = cls(wait_s)
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(cp.start())
            ready.set()
            loop.run_forever()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert ready.wait(10), "control plane did not start"
        try:
            yield cp
        finally:
            asyncio.run_coroutine_threadsafe(cp.stop(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)
            t.join(10)

    async def _config(self, request: web.Request) -> web.StreamResponse:
        assert self._changed is not None
        self.polls.append(dict(request.query))
        if not self.text or self.honour_have and request.query.get("have") == config_version(self.text):
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), self.wait_s)
            except TimeoutError:
                return web.Response(status=304)
        return web.json_response({"version": config_version(self.text), "yaml": self.text.decode()})

    async def _ack(self, request: web.Request) -> web.Response:
        self.acks.append(await request.json())
        return web.json_response({})
