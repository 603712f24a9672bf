"""CPU time of another process, at the kernel scheduler's nanosecond resolution.

/proc/PID/stat counts CPU in clock ticks (10 ms here): a smoke run's few requests can read as 0 s
and a ratio over it divides by zero. Linux exposes every process's own CPU-time clock
(clock_getcpuclockid), which sums all its threads, the exited ones included, in nanoseconds.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_CPUCLOCK_SCHED = 2  # the scheduler's runtime clock, what clock_getcpuclockid(3) hands out


def _clock_id(pid: int) -> int:
    # MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED) from the kernel's posix-timers.h
    return ((~pid) << 3) | _CPUCLOCK_SCHED


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` (all its threads) has used so far."""
    try:
        return time.clock_gettime(_clock_id(pid))
    except OSError:  # a kernel without per-process clocks: the tick counts, coarse but honest
        return tick_cpu_seconds(pid)


def tick_cpu_seconds(pid: int) -> float:
    """The same from /proc/PID/stat, in clock ticks: for processes that may be gone (reads raise)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
