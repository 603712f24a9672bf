"""A real PostgreSQL (Debian's `postgresql` package) in a temp dir on a free loopback port, for tests.

initdb and postgres refuse to run as root: as root, the server runs as the `postgres` user the
package creates. Trust auth on loopback only; fsync off (a test cluster is thrown away)."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def available() -> bool:
    return pg_bin("initdb") is not None and pg_bin("postgres") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self) -> None:
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="modelyard-pg-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}

    def dsn(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 30.0) -> None:
        data = self.dir / "data"
        if not data.exists():
            subprocess.run([pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                            "--no-sync"], check=True, capture_output=True, cwd=self.dir, **self._as)
        with open(self.dir / "postgres.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [pg_bin("postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.dir),
                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=50"],
                stdout=subprocess.DEVNULL, stderr=log, cwd=self.dir, **self._as)
        import psycopg

        deadline = time.monotonic() + timeout
        while True:  # readiness: a connection that answers a query
            try:
                with psycopg.connect(self.dsn(), connect_timeout=1) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"postgres did not start on port {self.port}: "
                                       f"{(self.dir / 'postgres.log').read_text()[-2000:]}") from None
                time.sleep(0.05)

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.dsn(name)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: SIGTERM's smart one waits for clients to leave
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_database(name: str) -> Iterator[tuple[PostgresServer, str]]:
    """A fresh server holding database `name` (its DSN), removed after; the test skips where
    PostgreSQL is not installed."""
    if not available():
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql)")
    pg = PostgresServer()
    pg.start()
    try:
        yield pg, pg.create_database(name)
    finally:
        pg.remove()
