"""The image's entry point run as a plain script (there is no Docker daemon here), and a role's start
waited for as its HEALTHCHECK sees it."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.stack_config import ROOT

ENTRYPOINT = ROOT / "deploy/docker/entrypoint.sh"


def wait_healthy(env: Mapping[str, str], role_file: Path, *, alive: Callable[[], None] = lambda: None,
                 deadline_s: float = 30.0) -> subprocess.CompletedProcess[str] | None:
    """The first healthy probe, or the last one. None runs before the entry point has written its role
    file: without one the probe has no role and says healthy (a one-off command's answer), and under
    load a probe can come first (seen in CI: healthy, then no role file)."""
    healthy = None
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        alive()
        if role_file.exists():
            healthy = subprocess.run(["sh", str(ENTRYPOINT), "healthcheck"], env=dict(env), capture_output=True,
                                     text=True, timeout=30)
            if healthy.returncode == 0:
                break
        time.sleep(0.2)
    return healthy
