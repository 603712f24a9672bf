"""Apply a config file whenever its content changes: a Kubernetes ConfigMap mounted as a volume
is updated in place (a symlink swap, so mtimes say little), hence a content hash every second."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from contracts.live_config import config_version
from controlplane.live.applier import LiveConfig

log = logging.getLogger("modelyard.controlplane.watch")


async def watch_file(path: Path, live: LiveConfig, interval_s: float = 1.0) -> None:
    seen = live.running.version  # the file the control plane started from
    unreadable = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            text = await asyncio.to_thread(path.read_bytes)
        except OSError as e:
            if not unreadable:
                log.warning("watch: cannot read %s (%s); the running config stays", path, e.strerror)
            unreadable = True
            continue
        unreadable = False
        version = config_version(text)
        if version == seen:
            continue
        # Once per content: a file that fails stays failed until it changes again.
        seen = version
        if version != live.running.version:
            await live.apply(text, source=f"{path} (file watch)", applied_by="file watch")
