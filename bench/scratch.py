"""A benchmark's scratch folders (stacks' logs, databases, wrk scripts): removed when the benchmark
ends well, kept and named when it fails, so a run leaves nothing behind but what explains a failure.

A benchmark makes its folders with `folder()` and runs as `raise SystemExit(run(main))`.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

_made: list[Path] = []
_kept: set[Path] = set()


def folder(prefix: str) -> Path:
    """A new folder under the system's temporary one, removed at the end of a run that ends well."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _made.append(path)
    return path


def keep(path: Path) -> None:
    """Keep `path` (a folder `folder()` made) after the run: the benchmark pointed a reader at it."""
    _kept.add(path)


def run(main: Callable[[], int]) -> int:
    """`main()`'s exit status; its folders removed if it is 0, kept and named if not (or if it raised)."""
    rc = 1
    try:
        rc = main()
        return rc
    finally:
        for path in _made:
            if rc == 0 and path not in _kept:
                shutil.rmtree(path, ignore_errors=True)
            else:
                print(f"{Path(sys.argv[0]).stem}: kept {path}", file=sys.stderr, flush=True)
