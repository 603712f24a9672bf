"""A stack of image models on one demo KServe server in its own process: for batching tests and the bench."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.stack_config import free_port
from tests.vision.formgen import build_form
from tests.vision.imagegen import encode

KEY = "sk-modelyard-demo"
LABELS = ["red", "green", "blue", "white", "black", "yellow", "cyan", "magenta"]
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255),
           "black": (0, 0, 0), "yellow": (255, 255, 0), "cyan": (0, 255, 255), "magenta": (255, 0, 255)}
_DEMO_TENANT = {"name": "demo", "tier": "L1", "allowed_models": ["*"],
                "api_keys": ["sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"]}


def vision_config(demo_port: int, models: dict[str, dict[str, Any] | None], dead: frozenset[str] = frozenset(),
                  deployments: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """Image models (name -> batching section, None = batching off) on one demo server; models in
    `dead` point at a port nobody listens on; `deployments` adds to a model's deployment (max_inflight...)."""
    out = []
    for i, (name, batching) in enumerate(models.items()):
        port = free_port() if name in dead else demo_port
        out.append({
            "name": name, "task_types": ["image-classification", "infer"],
            "capabilities": {"vision": True, "streaming": False}, "latency_ms": 20,
            "vision": {"input": {"name": "input", "width": 32, "height": 32, "datatype": "FP32"},
                       "output": "scores", "labels": LABELS, "max_images": 32},
            "batching": batching if batching is not None else {"enabled": False},
            "deployments": [{"cluster": f"kserve-{i}", "protocol": "kserve-grpc", "upstream_model": "demo-colors",
                             "endpoints": [f"127.0.0.1:{port}"], **(deployments or {}).get(name, {})}],
        })
    return {"listener": {"address": "127.0.0.1", "port": free_port()},
            "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}",
                        "image_backend": "auto"},
            "models": out, "tenants": [_DEMO_TENANT]}


@contextlib.contextmanager
def vision_stack(workdir: Path, models: dict[str, dict[str, Any] | None], demo_args: Sequence[str] = (),
                 dead: frozenset[str] = frozenset(), extproc: dict[str, Any] | None = None,
                 deployments: dict[str, dict[str, Any]] | None = None) -> Iterator[Any]:
    """Envoy + extproc + one demo KServe server (its own process, /stats and /control on `stack.demo_stats`);
    `extproc` adds to the config's extproc section."""
    from devstack.launcher import Child
    from tests.stack_config import start_stack

    port, stats = free_port(), free_port()
    data = vision_config(port, models, dead, deployments)
    data["extproc"].update(extproc or {})
    stack = start_stack(workdir, data, demos=False)
    argv = [sys.executable, "-m", "devstack.demo.kserve_server", "--port", str(port), "--stats-port", str(stats),
            *demo_args]
    stack.children.insert(0, Child("kserve-demo", argv, ("http", f"http://127.0.0.1:{stats}/stats")))
    stack.demo_stats = f"http://127.0.0.1:{stats}"
    with stack:
        yield stack


def classify_form(model: str, colours: list[str], fmt: str = "PNG",
                  size: tuple[int, int] = (32, 32)) -> tuple[bytes, str]:
    files = [("image", encode(COLOURS[c], size, fmt), f"{c}.{fmt.lower()}", None) for c in colours]
    return build_form([("model", model, None, None), *files])


def demo_stats(stack: Any) -> dict[str, int]:
    return httpx.get(f"{stack.demo_stats}/stats", timeout=5).json()
