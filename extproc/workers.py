"""`extproc.workers: N`: N extproc processes on one host, each its own port, behind Envoy's ext_proc
cluster (which balances streams across them like replicas).

Worker i listens on the configured address's port + i and serves metrics on metrics port + i.
`modelyard serve` is worker 0: it starts workers 1..N-1 (`serve --worker i`), waits until each
accepts connections, then binds its own port, so its readiness means every worker's. SIGTERM and
SIGHUP reach every worker; a worker dies with its parent (Linux).

Shared by the workers: the rate-limit buckets of the memory backend and the `max_inflight` slot
counts (files in one host directory that worker 0 makes and names in $MODELYARD_SHARED_DIR: see
ratelimit/host_buckets.py and extproc/host_slots.py), SQLite files (metering, audit, tasks), Redis.
Per process: the queue order in front of the slots (each queue bound divided among the workers),
scheduler feedback, watermark readings, Prometheus series.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from modelyard.errors import ConfigError

_MAX_DEFAULT = 8
# The directory of this host's shared limiter state; workers inherit it from worker 0.
SHARED_DIR_ENV = "MODELYARD_SHARED_DIR"


WORKER_ENV = "MODELYARD_WORKER"  # this process's index in its pool (set by `serve`)


def worker_index() -> int:
    return int(os.environ.get(WORKER_ENV) or 0)


def shared_dir() -> str | None:
    """This process's shared-state directory, when it is one worker of several."""
    return os.environ.get(SHARED_DIR_ENV) or None


def _make_shared_dir() -> str:
    """A fresh directory in RAM (/dev/shm) when there is one: the tables are mapped, never synced.
    Its name carries worker 0's pid, so one left by a `serve` that was killed is removed here."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    for old in Path(base).glob("modelyard-workers-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists() and sys.platform.startswith("linux"):
            shutil.rmtree(old, ignore_errors=True)
    path = tempfile.mkdtemp(prefix=f"modelyard-workers-{os.getpid()}-", dir=base)
    os.environ[SHARED_DIR_ENV] = path
    return path


def default_workers() -> int:
    """Half the cores this process may run on (Envoy and the upstreams want the rest), 1 to 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, min(_MAX_DEFAULT, cores // 2))


def worker_count(workers: int | None) -> int:
    """`extproc.workers` as configured, else the default."""
    return workers or default_workers()


def shifted(address: str, i: int) -> str:
    """`host:port` moved up by `i` ports (worker i's address); empty stays empty (metrics off)."""
    if not address or i == 0:
        return address
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) + i > 65535:
        raise ConfigError(f"extproc address {address!r}: worker {i} needs port {port} + {i}")
    return f"{host}:{int(port) + i}"


def worker_addresses(address: str, count: int) -> list[str]:
    """The gRPC addresses of `count` workers: Envoy's ext_proc cluster endpoints."""
    return [shifted(address, i) for i in range(count)]


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
    shared: str | None = None  # the shared-state directory; removed by `stop`

    @classmethod
    def start(cls, config_path: str | None, address: str, count: int, timeout_s: float = 60.0) -> WorkerPool:
        pool = cls(shared=_make_shared_dir())
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
        if self.shared is not None:
            shutil.rmtree(self.shared, ignore_errors=True)
            self.shared = None
