"""`extproc.workers: N`: N extproc processes on one host, each its own port, behind Envoy's ext_proc
cluster (which balances streams across them like replicas).

Worker i listens on the configured address's port + i and serves metrics on metrics port + i
(that plan is `contracts/workers.py`). `modelyard serve` is worker 0: it starts workers 1..N-1
(`serve --worker i`), waits until each accepts connections, then binds its own port, so its
readiness means every worker's. SIGTERM and SIGHUP reach every worker; a worker dies with its
parent (Linux). A worker that dies is started again with backoff while the others serve (Envoy sends them its
streams); one that cannot start at all (exits before it serves `FAILED_STARTS` times in a row) stops
`serve`, which says why.

Shared by the workers: the rate-limit buckets of the memory backend and the `max_inflight` slot
counts (files in one host directory that worker 0 makes and names in $MODELYARD_SHARED_DIR: see
ratelimit/host_buckets.py and extproc/admission/host_slots.py), SQLite files (metering, audit, tasks), Redis.
Per process: the queue order in front of the slots (each queue bound divided among the workers),
scheduler feedback, watermark readings, Prometheus series.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contracts.errors import ConfigError
from contracts.workers import shifted

log = logging.getLogger("modelyard.workers")

_MAX_DEFAULT = 8
# A dead worker's restart waits RESTART_S, doubling per quick death up to RESTART_CAP_S, back to
# RESTART_S after STABLE_S up (devstack.supervisor's Backoff, for the one process that has no up).
RESTART_S, RESTART_CAP_S, STABLE_S = 0.2, 30.0, 60.0
FAILED_STARTS = 3
_WATCH_S = 0.1
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
class _Restarts:
    """One worker's restart state (the watcher thread's alone)."""

    delay: float = RESTART_S
    due: float | None = None  # dead, restarting then
    starting: bool = False  # restarted, not yet accepting
    failed: int = 0  # exits before accepting, in a row
    started_at: float = field(default_factory=time.monotonic)


@dataclass
class WorkerPool:
    """Workers 1..N-1 of one `modelyard serve`, as child processes."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    argv: list[str] = field(default_factory=list)
    address: str = ""
    # Why `serve` must stop: a worker that cannot start at all (set by the watcher, read by serve).
    failure: str | None = None
    on_failure: Callable[[], object] | None = None  # called once `failure` is set
    _stopping: threading.Event = field(default_factory=threading.Event)
    shared: str | None = None  # the shared-state directory; removed by `stop`

    def _spawn(self, i: int) -> subprocess.Popen:
        linux = sys.platform.startswith("linux")
        return subprocess.Popen(self.argv + ["--worker", str(i)], preexec_fn=_die_with_parent if linux else None)

    @classmethod
    def start(cls, config_path: str | None, address: str, count: int, timeout_s: float = 60.0) -> WorkerPool:
        argv = [sys.executable, "-m", "modelyard.cli", "serve"] + (["--config", config_path] if config_path else [])
        pool = cls(argv=argv, address=address, shared=_make_shared_dir())
        try:
            for i in range(1, count):
                pool.procs.append(pool._spawn(i))
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
        threading.Thread(target=pool._watch, name="worker-restarts", daemon=True).start()
        return pool

    def _watch(self) -> None:
        """Restart dead workers with backoff until the pool stops (or one cannot start at all)."""
        state = [_Restarts() for _ in self.procs]
        while not self._stopping.wait(_WATCH_S):
            now = time.monotonic()
            for i, (proc, r) in enumerate(zip(self.procs, state, strict=True), start=1):
                if r.due is not None:
                    if now >= r.due and not self._stopping.is_set():
                        r.due, r.starting, r.started_at = None, True, now
                        self.procs[i - 1] = self._spawn(i)
                    continue
                code = proc.poll()
                if code is None:
                    if r.starting and _accepting(shifted(self.address, i)):
                        r.starting, r.failed = False, 0
                        log.warning("extproc worker %d restarted (pid %d) and serving", i, proc.pid)
                    continue
                if self._stopping.is_set():
                    return
                if r.starting:
                    r.failed += 1
                    if r.failed >= FAILED_STARTS:
                        self._fail(f"extproc worker {i} cannot start: {r.failed} starts in a row exited (last "
                                   f"with code {code}) before it served; its output above says why")
                        return
                if now - r.started_at >= STABLE_S:
                    r.delay = RESTART_S  # it had been fine for a while: not a crash loop
                r.due, r.starting = now + r.delay, False
                log.warning("extproc worker %d (pid %d) exited with code %s; restarting in %gs", i, proc.pid, code,
                            r.delay)
                r.delay = min(RESTART_CAP_S, r.delay * 2)

    def _fail(self, why: str) -> None:
        log.error("%s; stopping", why)
        self.failure = why
        if self.on_failure is not None:
            self.on_failure()

    def signal(self, sig: int) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(sig)

    def stop_async(self) -> None:
        """SIGTERM only: the workers drain while worker 0 does; `stop` waits for them afterwards."""
        self._stopping.set()
        self.signal(signal.SIGTERM)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (each drains like worker 0), then wait; SIGKILL what is still there after `timeout_s`."""
        self._stopping.set()
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
