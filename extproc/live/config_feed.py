"""The control plane's config, long-polled (`controlplane.enabled`): the wire is contracts/live_config.py.

`GET http://{api_address}{CONFIG_PATH}?have=<version>&worker=<id>` answers 200 with `{"version", "yaml"}`
once the control plane's version differs from `have`, else 304 after about WAIT_S. The text goes to the
`Reloader` (atomic: applied whole or refused whole), then `POST ACK_PATH` says which. `have` is the last
version this worker was offered, applied or refused, so a refused version is not offered again until
another replaces it (the ack said it was refused). While the control plane is down the gateway serves
its last config and retries with backoff; nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket

import aiohttp

from contracts.live_config import ACK_PATH, CONFIG_PATH, WAIT_S
from extproc.live.reload import Outcome, Reloader

log = logging.getLogger("modelyard.config_feed")

BACKOFF_S, BACKOFF_CAP_S = 0.5, 10.0


def worker_id(index: int) -> str:
    """Stable for the life of this process: host, pid and the worker's index in its pool."""
    return f"{socket.gethostname()}/{os.getpid()}/{index}"


class ConfigFeed:
    def __init__(self, api_address: str, reloader: Reloader, worker: str) -> None:
        self.base = f"http://{api_address}"
        self.reloader = reloader
        self.worker = worker
        self.have = reloader.live.version  # the last version offered to this worker
        self.outcomes: list[Outcome] = []  # the last few, newest last (status, tests)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="config-feed")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def run(self) -> None:
        delay, down = BACKOFF_S, ""
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    offered = await self._poll(http)
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
                    why = f"{type(e).__name__}: {e}"
                    if why != down:  # say it when it changes, not every retry
                        log.warning("control plane %s: %s; serving config %s meanwhile", self.base, why,
                                    self.reloader.live.version or "-")
                        down = why
                    await asyncio.sleep(delay * random.uniform(0.8, 1.2))  # jitter: workers do not retry in step
                    delay = min(BACKOFF_CAP_S, delay * 2)
                    continue
                if down:
                    log.warning("control plane %s answers again", self.base)
                delay, down = BACKOFF_S, ""
                if offered is not None and offered[0] == self.have:
                    # Offered what it was told we have: not applied again, and no hot loop on a server that
                    # does not wait on `have`.
                    await asyncio.sleep(BACKOFF_S)
                elif offered is not None:
                    await self._apply(http, *offered)

    async def _poll(self, http: aiohttp.ClientSession) -> tuple[str, str, str] | None:
        """(version, yaml, who applied it) when the control plane has another version; None when it had nothing new."""
        params = {"have": self.have, "worker": self.worker}
        timeout = aiohttp.ClientTimeout(total=WAIT_S + 10, connect=5)
        async with http.get(self.base + CONFIG_PATH, params=params, timeout=timeout) as resp:
            if resp.status == 304:
                return None
            if resp.status != 200:
                raise ValueError(f"{CONFIG_PATH} answered {resp.status}")
            doc = await resp.json(content_type=None)
        if not isinstance(doc, dict) or not isinstance(doc.get("yaml"), str):
            raise ValueError(f"{CONFIG_PATH} answered 200 without a yaml text")
        return str(doc.get("version") or ""), doc["yaml"], str(doc.get("applied_by") or "")

    async def _apply(self, http: aiohttp.ClientSession, offered: str, text: str, applied_by: str = "") -> None:
        out = await self.reloader.apply_text(text.encode(), source="controlplane", origin=self.base + CONFIG_PATH,
                                             applied_by=applied_by)
        if offered and out.version != offered:  # the hash is of the same bytes on both sides
            log.warning("control plane said version %s for a text whose hash is %s", offered, out.version)
        self.have = offered or out.version
        self.outcomes = [*self.outcomes[-9:], out]
        ack = {"worker": self.worker, "version": out.version, "ok": out.ok, "error": out.error}
        try:
            async with http.post(self.base + ACK_PATH, json=ack, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as e:  # the next poll's `have` says it anyway
            log.warning("control plane %s: ack of %s not delivered: %s", self.base, out.version, e)
