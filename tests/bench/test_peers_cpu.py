"""bench_peers counts a gateway's CPU over its whole process tree (LiteLLM's and Modelyard's workers)."""

from __future__ import annotations

import os
import subprocess
import sys

from bench.bench_peers import tree_cpu_s


def test_a_childs_cpu_counts_toward_its_parent() -> None:
    # A child that burns about 0.3 s of CPU, then waits: while it lives, the tree holds its time.
    child = subprocess.Popen([sys.executable, "-c", "import sys,time\nt=time.process_time()\n"
                              "while time.process_time()-t<0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "done"
        alone = tree_cpu_s([child.pid])
        assert alone >= 0.25
        assert tree_cpu_s([os.getpid()]) >= alone  # this process plus the child
    finally:
        child.communicate("")
