"""The demo config with every port moved to a free one, for stacks started by tests."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
_ADDR = re.compile(r"(127\.0\.0\.1):(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
