"""The demo config with every port moved to a free one, for stacks started by tests."""

from __future__ import annotations

import os
import random
import re
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
_ADDR = re.compile(r"(127\.0\.0\.1):(\d+)")


_HANDED_OUT: set[int] = set()
# Under pytest-xdist each worker picks from its own band below the kernel's ephemeral range
# (32768+), so two workers never hand out one port and no client socket takes one meanwhile.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_BAND_START, _BAND_SIZE = 10_000, 2_500


def _band() -> range | None:
    if not _XDIST_WORKER.startswith("gw"):
        return None
    start = _BAND_START + int(_XDIST_WORKER[2:]) * _BAND_SIZE
    return range(start, start + _BAND_SIZE)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free now and not handed out before in this run: a stack binds its ports only
    when its children start, so two picks must not land on the same one."""
    band = _band()
    while True:
        if band is not None:
            port = random.choice(band)
            if port in _HANDED_OUT or not _bindable(port):
                continue
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def free_ports_run(n: int) -> int:
    """A port p with p..p+n-1 all free now and none handed out before: the base address of
    `extproc.workers: n` (a worker on a port another child of the stack binds later cannot start)."""
    while True:
        base = free_port()
        rest = range(base + 1, base + n)
        band = _band()
        if any(p in _HANDED_OUT or not _bindable(p) or (band is not None and p not in band) for p in rest):
            continue  # `base` stays handed out: harmless, and it keeps the next pick off it
        _HANDED_OUT.update(rest)
        return base


def _remap(value: Any, ports: dict[str, int]) -> Any:
    if isinstance(value, dict):
        return {k: _remap(v, ports) for k, v in value.items()}
    if isinstance(value, list):
        return [_remap(v, ports) for v in value]
    if isinstance(value, str):
        return _ADDR.sub(lambda m: f"{m[1]}:{ports.setdefault(m[2], free_port())}", value)
    return value


def without_mcp(data: dict[str, Any]) -> dict[str, Any]:
    """The config without its MCP servers: a stack that tests no /mcp starts no MCP processes
    (tests/e2e/test_mcp.py puts the shipped ones back)."""
    data.pop("mcp_servers", None)
    data.pop("mcp", None)
    data.get("devstack", {}).pop("demo_mcp_servers", None)
    data.get("devstack", {}).pop("demo_oauth", None)
    return data


def demo_config_free_ports(*, shipped: Path = ROOT / "modelyard.yaml",
                           **overrides: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """The shipped modelyard.yaml (its MCP servers left out; `shipped`: another checkout's), every
    127.0.0.1 port replaced; returns (config, old->new ports)."""
    data = without_mcp(yaml.safe_load(shipped.read_text()))
    ports: dict[str, int] = {}
    data = _remap(data, ports)
    data["listener"]["port"] = free_port()
    _static_envoy(data)
    _without_endpoint_picker(data)
    data.update(overrides)
    return data, ports


def _without_endpoint_picker(data: dict[str, Any]) -> None:
    """Test stacks start the endpoint picker (a process and a listener) only where a test sets
    `endpoint_picker` itself (tests/e2e/test_endpoint_picker.py): the rest need not pay for it."""
    data.pop("endpoint_picker", None)


def _static_envoy(data: dict[str, Any]) -> None:
    """Test stacks run Envoy on the static bootstrap whatever the shipped file says; a test that
    wants the control plane sets `controlplane.enabled` itself (tests/e2e/test_live_config.py)."""
    data["controlplane"] = {**data.get("controlplane", {}), "enabled": False}


def start_stack(workdir: Path, data: dict[str, Any], env: Any = None, *, demos: bool = True,
                shared_demos: bool = False):
    """A `Stack` (not yet started) for a test's own config; use it as a context manager. With
    `demos`, every cluster the test named demo-* is declared a demo upstream (a test convention:
    `modelyard up` itself launches only what `devstack.demo_upstreams` lists). With `shared_demos`,
    the HTTP demos run in one process (devstack.demo.host): for stacks of many demos whose tests
    neither stop nor re-argue one of them."""
    # A demo-* cluster on an address another one already serves is the same server, not a second one.
    chosen: list[str] = []
    served: set[str] = set()
    for d in (d for m in data["models"] for d in m["deployments"]):
        eps = set(d.get("endpoints") or [])
        if demos and d["cluster"].startswith("demo-") and (not eps or not eps <= served):
            chosen.append(d["cluster"])
            served |= eps
    data.setdefault("devstack", {})["demo_upstreams"] = list(dict.fromkeys(chosen))
    from contracts.config import parse_config
    from controlplane.environments import EnvironmentConfig
    from devstack.launcher import Stack

    ext = data.setdefault("extproc", {})
    # One worker unless a test asks: worker i takes port + i, which a free port does not promise.
    ext.setdefault("workers", 1)
    for db in ("metering_db", "audit_db"):
        if ext.get(db) and not Path(ext[db]).is_absolute():
            ext[db] = str(workdir / Path(ext[db]).name)  # keep test runs out of the repo
    for m in data["models"]:  # a stack's own cloud credentials: the demos write them on first start
        for d in m["deployments"]:
            for cloud in ("bedrock", "vertex"):
                sect = d.get(cloud)
                if sect and sect.get("credentials_file") and not Path(sect["credentials_file"]).is_absolute():
                    d[cloud] = {**sect, "credentials_file": str(workdir / Path(sect["credentials_file"]).name)}
    mcp = data.get("mcp")
    if mcp and mcp.get("sqlite_path") and not Path(mcp["sqlite_path"]).is_absolute():
        data["mcp"] = {**mcp, "sqlite_path": str(workdir / Path(mcp["sqlite_path"]).name)}
    if ext.get("unix_socket") and not Path(ext["unix_socket"]).is_absolute():
        # Its own socket per stack, on a short path (a Unix socket's path holds 107 bytes; tmp_path's may not).
        ext["unix_socket"] = str(Path(tempfile.mkdtemp(prefix="my-", dir="/tmp")) / "extproc.sock")
    tasks = ext.get("tasks")
    if tasks and tasks.get("sqlite_path") and not Path(tasks["sqlite_path"]).is_absolute():
        ext["tasks"] = {**tasks, "sqlite_path": str(workdir / Path(tasks["sqlite_path"]).name)}
    batches = ext.get("batches")
    if batches and not Path(batches.get("sqlite_path", "run/batches.sqlite")).is_absolute():
        ext["batches"] = {**batches, "sqlite_path": str(workdir / "batches.sqlite")}
    path = workdir / "modelyard.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env or EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)
    return Stack(parse_config(data), env, config_path=path, workdir=workdir, demos=demos,
                 shared_demos=shared_demos)


def small_config(**overrides: Any) -> dict[str, Any]:
    """One OpenAI demo model and the demo tenants, on free ports: a cheap stack for focused tests."""
    data = without_mcp(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["models"] = [m for m in data["models"] if m["name"] == "demo-gpt"]
    data["models"][0]["deployments"] = data["models"][0]["deployments"][:1]
    data["models"][0]["deployments"][0].pop("watermark", None)
    data["models"][0]["deployments"][0].pop("api_key_env", None)
    data.pop("ratelimit", None)
    data = _remap(data, {})
    data["listener"]["port"] = free_port()
    _static_envoy(data)
    _without_endpoint_picker(data)
    data.update(overrides)
    return data


def add_extproc_replica(stack: Any, data: dict[str, Any], workdir: Path) -> tuple[str, str]:
    """A second extproc process on its own port, started before Envoy: (address, metrics address)."""
    from devstack.launcher import Child

    addr, metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    replica = {**data, "extproc": {**data["extproc"], "address": addr, "metrics_address": metrics}}
    path = workdir / "modelyard-replica.yaml"
    path.write_text(yaml.safe_dump(replica, sort_keys=False))
    import sys

    child = Child("extproc-2", [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(path)], ("tcp", addr),
                  role="replica")
    stack.children.insert(len(stack.children) - 1, child)
    return addr, metrics


def without_watermarks(data: dict[str, Any]) -> dict[str, Any]:
    """Drop every deployment's watermark source: unit tests run no agents."""
    for m in data["models"]:
        for d in m["deployments"]:
            d.pop("watermark", None)
    return data


def until(cond: Callable[[], object], timeout: float = 20.0) -> None:
    """Wait for a stack to reach a state (a metric, a count) that it reaches on its own time."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)
