"""A real Envoy on Modelyard's rendered bootstrap with nobody at its ext_proc address (the filter
fails closed with a 500, which is enough to log a request and count its stats)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

from contracts.config import parse_config
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import EnvironmentConfig
from devstack.launcher import envoy_binary
from tests.stack_config import free_port, small_config


class BareEnvoy:
    def __init__(self, workdir: Path, env: EnvironmentConfig):
        data = small_config()
        data["extproc"]["address"] = f"127.0.0.1:{free_port()}"  # nobody listens: ext_proc fails closed
        self.port = data["listener"]["port"]
        self.config = workdir / "envoy.yaml"
        self.config.write_text(render_bootstrap(parse_config(data), env))
        self.log = workdir / "envoy.log"
        self.admin_path = workdir / "admin.txt"

    def __enter__(self) -> BareEnvoy:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([envoy_binary(), "-c", str(self.config), "--concurrency", "1",
                                          "--disable-hot-restart", "--log-level", "warn",
                                          "--admin-address-path", str(self.admin_path)],
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"envoy not listening; see {self.log}")

    def stat(self, name: str) -> int:
        admin = self.admin_path.read_text().strip()
        return int(httpx.get(f"http://{admin}/stats?filter=^{name}$&format=json", timeout=5).json()["stats"][0]["value"])

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)
