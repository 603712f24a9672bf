"""The stacks the chaos scenarios break: a model with two same-protocol deployments (each with
its fake watermark agent), and the one-deployment stack with two extproc replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.environments import EnvironmentConfig
from tests.stack_config import add_extproc_replica, free_port, small_config, start_stack

TWIN = "twin"
A, B = "demo-chaos-a", "demo-chaos-b"
TIMEOUT_MS = 1500  # the deployments' timeout: a demo-slow answer (30 s) runs past it
CHUNK_DELAY_S = 0.01  # streams last long enough to be cut mid-way


def twin_config() -> dict[str, Any]:
    """Model `twin` on deployments A and B: peers (one failover cluster), A first in config."""
    def dep(cluster: str) -> dict[str, Any]:
        return {"cluster": cluster, "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"],
                "timeout_ms": TIMEOUT_MS, "watermark": {"url": f"http://127.0.0.1:{free_port()}/watermarks"}}

    data = small_config()
    data["models"] = [{"name": TWIN, "quality": 0.7, "deployments": [dep(A), dep(B)]}]
    for t in data["tenants"]:
        t["allowed_models"] = [TWIN]
    data["extproc"]["metering_db"] = "metering.sqlite"
    data["routing"] = {"strategies": {"pinned": {"quality": 1}},
                       "watermarks": {"interval_s": 0.2, "stale_after_intervals": 3},
                       "cooldown": {"failures": 3, "window_s": 30, "cooldown_s": 30}}
    return data


def with_pinned(data: dict[str, Any]) -> dict[str, Any]:
    """The `pinned` strategy the chaos load asks for (see traffic.PINNED)."""
    data.setdefault("routing", {}).setdefault("strategies", {})["pinned"] = {"quality": 1}
    return data


def slow_streams(stack: Any) -> Any:
    """Demo upstreams pause between stream events, so a client can leave mid-stream."""
    for child in stack.children:
        if child.name.startswith("demo-"):
            child.argv += ["--chunk-delay", str(CHUNK_DELAY_S)]
    return stack


def replicated_stack(workdir: Path, data: dict[str, Any]) -> tuple[Any, str]:
    """A stack (not started) whose Envoy spreads streams over two extproc replicas; returns the
    stack and the second replica's metrics address."""
    data["extproc"].setdefault("metering_db", "metering.sqlite")
    with_pinned(data)
    stack = start_stack(workdir, data, EnvironmentConfig(name="chaos", admin=None, concurrency=1))
    second, second_metrics = add_extproc_replica(stack, data, workdir)
    stack.env = EnvironmentConfig(name="chaos", admin=None, concurrency=1,
                                  extproc_endpoints=[data["extproc"]["address"], second])
    return stack, second_metrics
