"""A small filesystem of its own for a test's run directory, to fill on purpose: a tmpfs mount
(root), else a loop-mounted ext4 file; a test skips, with the error, where both are refused."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(argv: list[str]) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    return "" if r.returncode == 0 else f"{' '.join(argv)}: {r.stderr.strip() or r.returncode}"


@contextlib.contextmanager
def small_disk(where: Path, size_kib: int) -> Iterator[Path]:
    """`where`, mounted as a filesystem of about `size_kib`, unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    errors = [_mount(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k,mode=0700", "tmpfs", str(where)])]
    if errors[-1]:
        image = where.parent / f"{where.name}.img"
        with open(image, "wb") as f:
            f.truncate(size_kib * 1024)
        mkfs = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True, timeout=60)
        errors.append(mkfs.stderr.strip() if mkfs.returncode else _mount(["mount", "-o", "loop", str(image), str(where)]))
    if errors[-1]:
        pytest.skip(f"no small filesystem can be mounted here: {'; '.join(errors)}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30)


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with one file (deleted later to give the space back)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 16, 4096, 512, 1):  # big writes first, then the last page's crumbs
            while True:
                try:
                    f.write(b"\0" * chunk)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
        os.fsync(f.fileno())
    return filler
