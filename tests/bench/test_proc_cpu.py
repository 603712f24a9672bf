"""bench.proc_cpu reads another process's CPU at nanosecond resolution, exited threads included."""

from __future__ import annotations

import subprocess
import sys

from bench.proc_cpu import cpu_seconds, tick_cpu_seconds

# Burns `ms` of CPU in a thread that then exits, says so, and waits to be read.
CHILD = """
import sys, threading, time
def burn():
    t = time.thread_time()
    while time.thread_time() - t < {s}: pass
th = threading.Thread(target=burn); th.start(); th.join()
print('done', flush=True)
sys.stdin.read()
"""


def _burning_child(seconds: float) -> subprocess.Popen[str]:
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(s=seconds)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "done"
    return child


def test_a_few_milliseconds_of_cpu_read_as_more_than_nothing() -> None:
    # The smoke runs' case: less work than one 10 ms clock tick still counts.
    child = _burning_child(0.002)
    try:
        first = cpu_seconds(child.pid)
        assert first > 0.002
        assert cpu_seconds(child.pid) >= first  # monotonic
    finally:
        child.communicate("")


def test_an_exited_threads_cpu_still_counts() -> None:
    child = _burning_child(0.2)
    try:
        assert cpu_seconds(child.pid) >= 0.2
        assert abs(cpu_seconds(child.pid) - tick_cpu_seconds(child.pid)) < 0.05  # the same clock, finer
    finally:
        child.communicate("")
