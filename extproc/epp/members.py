"""Pool membership: the config's static list, `$MODELYARD_EPP_ENDPOINTS`, and a file re-read when
it changes (a Kubernetes ConfigMap, or whatever keeps the pool's pod addresses current there).
A file that cannot be read or parsed keeps the last good membership."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from contracts.config.endpoint_picker import ENDPOINTS_ENV, EndpointPickerConfig, parse_endpoints

log = logging.getLogger(__name__)


class PoolMembers:
    def __init__(self, config: EndpointPickerConfig, on_change: Callable[[list[str]], None],
                 environ: Mapping[str, str] = os.environ) -> None:
        self.config = config
        self.on_change = on_change
        self.fixed = list(config.endpoints) + parse_endpoints(environ.get(ENDPOINTS_ENV, ""))
        self.from_file: list[str] = []
        self._seen: str | None = None
        self.current: list[str] = list(dict.fromkeys(self.fixed))

    def load_file(self, text: str | None) -> None:
        """A new read of the file (None: unreadable); applies it when its content changed."""
        if text is None or text == self._seen:
            return
        try:
            self.from_file = parse_endpoints(text)
        except ValueError as e:
            log.warning("endpoint picker: %s: %s (keeping %d endpoints)", self.config.endpoints_file, e,
                        len(self.current))
            return
        finally:
            self._seen = text
        members = list(dict.fromkeys([*self.fixed, *self.from_file]))
        if members != self.current:
            log.info("endpoint picker: pool %s now %s", self.config.pool, ", ".join(members) or "empty")
            self.current = members
            self.on_change(members)

    def read_file(self) -> str | None:
        assert self.config.endpoints_file is not None
        try:
            return Path(self.config.endpoints_file).read_text()
        except OSError as e:
            if self._seen is not None:
                log.warning("endpoint picker: %s: %s", self.config.endpoints_file, e)
                self._seen = None
            return None

    async def watch(self, interval_s: float = 1.0) -> None:
        """Re-read the file every `interval_s` in a worker thread (a ConfigMap changes by a symlink swap)."""
        if self.config.endpoints_file is None:
            return
        while True:
            self.load_file(await asyncio.to_thread(self.read_file))
            await asyncio.sleep(interval_s)
