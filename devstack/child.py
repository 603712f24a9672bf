"""One child process of the dev stack: how to start it, where it logs, when it is ready, and what
its death means for the stack (its role)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# essential: its death stops the stack (Envoy: nothing is served without it).
# replica:   one of interchangeable ones (extproc); restarted, and the stack stops only when all are dead.
# auxiliary: restarted with backoff; the stack serves on meanwhile (demo upstreams, fake agents).
Role = Literal["essential", "replica", "auxiliary"]


@dataclass
class Child:
    name: str
    argv: list[str]
    ready: tuple[str, str]  # ("http", url) | ("tcp", host:port)
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    role: Role = "auxiliary"
    started_at: float = 0.0  # time.monotonic() of the last spawn
    cwd: Path | None = None  # None: the parent's working directory

    def log_path(self, log_dir: Path) -> Path:
        return log_dir / f"{self.name.replace('@', '-')}.log"

    def spawn(self, log_dir: Path) -> None:
        """Start the process, appending its output to its log file (restarts keep the history)."""
        with open(self.log_path(log_dir), "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        """The exit code once the process has exited; None while it runs (or was never started)."""
        return self.proc.poll() if self.proc is not None else None

    def is_ready(self) -> bool:
        """One probe of the readiness target, without waiting."""
        kind, target = self.ready
        return (_http_ok if kind == "http" else _tcp_ok)(target)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return 200 <= r.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tcp_ok(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=0.5):
            return True
    except OSError:
        return False
