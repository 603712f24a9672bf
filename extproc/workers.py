"""`extproc.workers: N`: N extproc processes on one host, each its own port, behind Envoy's ext_proc
cluster (which balances streams across them like replicas).

Worker i listens on the configured address's port + i and serves metrics on metrics port + i
(that plan is `contracts/workers.py`). `modelyard serve` is worker 0: it starts workers 1..N-1
(`serve --worker i`), waits until each accepts connections, then binds its own port, so its
readiness means every worker's. SIGTERM and SIGHUP reach every worker; a worker dies with its
parent (Linux).

Per process, as with replicas: in-memory rate-limit buckets (use `ratelimit.backend: redis` for
limits exact across workers), `max_inflight` slots and queues, scheduler feedback, watermark
readings, Prometheus series. Shared: SQLite files (metering, audit, tasks), Redis.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from contracts.workers import shifted
from modelyard.errors import ConfigError


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent goes, so no worker outlives `serve`."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _accepting(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class WorkerPool:
    """Workers 1..N-1 of one `modelyard serve`, as child processes."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    @classmethod
    def start(cls, config_path: str | None, address: str, count: int, timeout_s: float = 60.0) -> WorkerPool:
        pool = cls()
        argv = [sys.executable, "-m", "modelyard.cli", "serve"] + (["--config", config_path] if config_path else [])
        linux = sys.platform.startswith("linux")
        try:
            for i in range(1, count):
                pool.procs.append(subprocess.Popen(argv + ["--worker", str(i)],
                                                   preexec_fn=_die_with_parent if linux else None))
            deadline = time.monotonic() + timeout_s
            for i, proc in enumerate(pool.procs, start=1):
                while not _accepting(shifted(address, i)):
                    if proc.poll() is not None:
                        raise ConfigError(f"extproc worker {i} exited with {proc.returncode} before serving")
                    if time.monotonic() > deadline:
                        raise ConfigError(f"extproc worker {i} not serving after {timeout_s:.0f}s")
                    time.sleep(0.05)
        except BaseException:
            pool.stop()
            raise
        return pool

    def signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def stop_async(self) -> None:
        """SIGTERM only: the workers drain while worker 0 does; `stop` waits for them afterwards."""
        self.signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (each drains like worker 0), then wait; SIGKILL what is still there after `timeout_s`."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
