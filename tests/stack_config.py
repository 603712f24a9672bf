"""The demo config with every port moved to a free one, for stacks started by tests."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
_ADDR = re.compile(r"(127\.0\.0\.1):(\d+)")


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this process: a stack binds its ports only
    when its children start, so two picks must not land on the same one."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def free_ports_run(n: int) -> int:
    """A port p with p..p+n-1 all free now: the base address of `extproc.workers: n`."""
    while True:
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


def _remap(value: Any, ports: dict[str, int]) -> Any:
    if isinstance(value, dict):
        return {k: _remap(v, ports) for k, v in value.items()}
    if isinstance(value, list):
        return [_remap(v, ports) for v in value]
    if isinstance(value, str):
        return _ADDR.sub(lambda m: f"{m[1]}:{ports.setdefault(m[2], free_port())}", value)
    return value


def demo_config_free_ports(**overrides: Any) -> tuple[dict[str, Any], dict[str, int]]:
    """The shipped modelyard.yaml, every 127.0.0.1 port replaced; returns (config, old->new ports)."""
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    ports: dict[str, int] = {}
    data = _remap(data, ports)
    data["listener"]["port"] = free_port()
    data.update(overrides)
    return data, ports


def start_stack(workdir: Path, data: dict[str, Any], env: Any = None, *, demos: bool = True):
    """A `Stack` (not yet started) for a test's own config; use it as a context manager. With
    `demos`, every cluster the test named demo-* is declared a demo upstream (a test convention:
    `modelyard up` itself launches only what `devstack.demo_upstreams` lists)."""
    clusters = [d["cluster"] for m in data["models"] for d in m["deployments"]]
    data.setdefault("devstack", {})["demo_upstreams"] = [c for c in dict.fromkeys(clusters)
                                                         if demos and c.startswith("demo-")]
    from contracts.config import parse_config
    from controlplane.environments import EnvironmentConfig
    from devstack.launcher import Stack

    ext = data.setdefault("extproc", {})
    # One worker unless a test asks: worker i takes port + i, which a free port does not promise.
    ext.setdefault("workers", 1)
    for db in ("metering_db", "audit_db"):
        if ext.get(db) and not Path(ext[db]).is_absolute():
            ext[db] = str(workdir / Path(ext[db]).name)  # keep test runs out of the repo
    tasks = ext.get("tasks")
    if tasks and tasks.get("sqlite_path") and not Path(tasks["sqlite_path"]).is_absolute():
        ext["tasks"] = {**tasks, "sqlite_path": str(workdir / Path(tasks["sqlite_path"]).name)}
    path = workdir / "modelyard.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    env = env or EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1)
    return Stack(parse_config(data), env, config_path=path, workdir=workdir, demos=demos)


def small_config(**overrides: Any) -> dict[str, Any]:
    """One OpenAI demo model and the demo tenants, on free ports: a cheap stack for focused tests."""
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"] = [m for m in data["models"] if m["name"] == "demo-gpt"]
    data["models"][0]["deployments"] = data["models"][0]["deployments"][:1]
    data["models"][0]["deployments"][0].pop("watermark", None)
    data["models"][0]["deployments"][0].pop("api_key_env", None)
    data.pop("ratelimit", None)
    data = _remap(data, {})
    data["listener"]["port"] = free_port()
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
