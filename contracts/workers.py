"""The worker plan: how many extproc processes one host runs and where each listens.

`extproc.workers: N`: worker i listens on the configured address's port + i (and serves metrics
on metrics port + i). The control plane lists these addresses as Envoy's ext_proc cluster
endpoints; `extproc/workers.py` starts the processes on them.
"""

from __future__ import annotations

import os

from contracts.errors import ConfigError

_MAX_DEFAULT = 8


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


# sockaddr_un's sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


def worker_socket(path: str | None, i: int) -> str | None:
    """Worker i's Unix socket (`extproc.unix_socket`): the path itself for worker 0, `<path>.<i>` after."""
    if not path:
        return None
    out = path if i == 0 else f"{path}.{i}"
    if len(os.fsencode(out)) > MAX_SOCKET_PATH:
        raise ConfigError(f"extproc.unix_socket {out!r} is longer than a Unix socket path may be "
                          f"({MAX_SOCKET_PATH} bytes): pick a shorter path")
    return out


def worker_sockets(path: str, count: int) -> list[str]:
    """The Unix sockets of `count` workers: Envoy's ext_proc cluster endpoints when the extproc is local."""
    return [s for i in range(count) if (s := worker_socket(path, i)) is not None]
