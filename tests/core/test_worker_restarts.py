"""`serve`'s pool keeps its workers: one that dies is started again (its port serves again), and
one that cannot start at all stops `serve` with the reason. Cheap real processes stand in for
`serve --worker i` (each listens on the port worker i would, or exits at once)."""

from __future__ import annotations

import sys
import threading
import time

from extproc.workers import WorkerPool, _accepting, shifted
from tests.stack_config import free_ports_run

# Worker i listens on the base port + i (its last argument), like `serve --worker i`.
LISTENER = [sys.executable, "-c", "import socket, sys, time\n"
            "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            "s.bind(('127.0.0.1', int(sys.argv[1]) + int(sys.argv[-1]))); s.listen(); time.sleep(60)"]
FAILS = [sys.executable, "-c", "import sys; print('ConfigError: bad'); sys.exit(2)"]


def _until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def _pool(argv: list[str], base: int) -> WorkerPool:
    pool = WorkerPool(argv=argv, address=f"127.0.0.1:{base}")
    pool.procs.append(pool._spawn(1))
    threading.Thread(target=pool._watch, daemon=True).start()
    return pool


def test_a_dead_worker_is_started_again_and_serves() -> None:
    base = free_ports_run(2)
    pool = _pool([*LISTENER, str(base)], base)
    try:
        first = pool.procs[0]
        assert _until(lambda: _accepting(shifted(pool.address, 1)), 30)
        first.kill()
        first.wait()
        assert _until(lambda: pool.procs[0] is not first and _accepting(shifted(pool.address, 1)), 30)
        assert pool.procs[0].poll() is None and pool.failure is None
    finally:
        pool.stop(timeout_s=5)
    assert all(p.poll() is not None for p in pool.procs)  # stopped: nothing restarted after


def test_a_worker_that_cannot_start_stops_serve_with_the_reason() -> None:
    base = free_ports_run(2)
    stopped = threading.Event()
    pool = _pool([*LISTENER, str(base)], base)
    pool.on_failure = stopped.set
    try:
        assert _until(lambda: _accepting(shifted(pool.address, 1)), 30)
        pool.argv = FAILS  # from now on every start of worker 1 fails at once
        pool.procs[0].kill()
        assert stopped.wait(30)
        assert pool.failure == ("extproc worker 1 cannot start: 3 starts in a row exited (last with code 2) "
                                "before it served; its output above says why")
    finally:
        pool.stop(timeout_s=5)


def test_a_worker_ended_by_stop_is_not_started_again() -> None:
    base = free_ports_run(2)
    pool = _pool([*LISTENER, str(base)], base)
    assert _until(lambda: _accepting(shifted(pool.address, 1)), 30)
    worker = pool.procs[0]
    pool.stop(timeout_s=5)
    time.sleep(0.5)  # five watch intervals: a restart would have begun
    assert pool.procs == [worker] and worker.poll() is not None
