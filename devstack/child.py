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
# replica:   one of interchangeable ones (extproc); restarted at once (from its standby when it has
#            one); the stack stops only when it cannot start at all.
# auxiliary: restarted with backoff; the stack serves on meanwhile (demo upstreams, fake agents).
Role = Literal["essential", "replica", "auxiliary"]
STANDBY_RETRY_S = 10.0


@dataclass
class Child:
    name: str
    argv: list[str]
    ready: tuple[str, str]  # ("http", url) | ("tcp", host:port)
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)
    role: Role = "auxiliary"
    cwd: Path | None = None  # None: the parent's working directory
    # A warm spare: started ahead with these arguments, it imports what a start needs and waits for
    # a line on stdin to take over; a restart then costs a config load and a bind, not the imports.
    standby_argv: list[str] | None = None
    standby: subprocess.Popen | None = None
    standby_started_at: float = 0.0

    def log_path(self, log_dir: Path) -> Path:
        return log_dir / f"{self.name.replace('@', '-')}.log"

    def spawn(self, log_dir: Path) -> None:
        """Start the process (its standby takes over when one waits), appending its output to its
        log file (restarts keep the history)."""
        if self.standby is not None and self.standby.poll() is None and self._release_standby():
            self.proc, self.standby = self.standby, None
        else:
            self.stop_standby()
            with open(self.log_path(log_dir), "ab") as log:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                             env=self._environ())

    def spawn_standby(self, log_dir: Path) -> None:
        """Start the warm spare, unless there is no such thing for this child or one is waiting;
        one that died on its own (a broken install, say) is tried again only STANDBY_RETRY_S later."""
        if self.standby_argv is None:
            return
        if self.standby is not None:
            if self.standby.poll() is None or time.monotonic() - self.standby_started_at < STANDBY_RETRY_S:
                return
            self.stop_standby()
        with open(self.log_path(log_dir), "ab") as log:
            self.standby = subprocess.Popen(self.standby_argv, stdin=subprocess.PIPE, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.cwd, env=self._environ())
        self.standby_started_at = time.monotonic()

    def _release_standby(self) -> bool:
        assert self.standby is not None and self.standby.stdin is not None
        try:
            self.standby.stdin.write(b"go\n")
            self.standby.stdin.close()
            return True
        except OSError:  # it died just now
            return False

    def stop_standby(self) -> None:
        """End the spare: it holds nothing yet (no port, no file), so SIGKILL loses nothing."""
        standby, self.standby = self.standby, None
        if standby is not None:
            standby.kill()
            standby.wait()
            if standby.stdin is not None:
                standby.stdin.close()

    def log_tail(self, log_dir: Path, lines: int = 10) -> str:
        """The last lines of its log: why it would not start, usually."""
        try:
            text = self.log_path(log_dir).read_bytes()[-8192:].decode("utf-8", "replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])

    def _environ(self) -> dict[str, str]:
        return {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}

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
