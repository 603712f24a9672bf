"""The stack the drop_params and large-answer tests share: a few demo models on free ports, with
drop_params set on some, and a max_body_bytes a 2048 x 1536 Gemini embeddings answer fits under."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import UPSTREAM_KEYS
from tests.stack_config import demo_config_free_ports, start_stack

# ~30 MB: a 2048 x 1536 Gemini batchEmbedContents answer (~29.9 MB of demo JSON) fits; 2048 x 1800 does not.
MAX_BODY_BYTES = 31 * 1024 * 1024


def params_config() -> dict[str, Any]:
    data, _ = demo_config_free_ports()
    keep = {"demo-gpt", "demo-claude", "demo-embed", "demo-embed-gemini"}
    models = [m for m in data["models"] if m["name"] in keep]
    for m in models:
        m.pop("groups", None)
        for d in m["deployments"]:
            d.pop("watermark", None)
            d.pop("warmup", None)
    gpt = next(m for m in models if m["name"] == "demo-gpt")
    gpt["deployments"] = gpt["deployments"][:1]
    claude = next(m for m in models if m["name"] == "demo-claude")
    # The same upstreams under models whose policy drops: all (model-wide) or seed (the deployment's).
    models.append({**gpt, "name": "demo-gpt-drop", "drop_params": True})
    models.append({**claude, "name": "demo-claude-drop",
                   "deployments": [{**d, "drop_params": ["seed"]} for d in claude["deployments"]]})
    data["models"] = models
    data["tenants"] = [t for t in data["tenants"] if t["name"] == "demo"]
    data.pop("ratelimit", None)
    data.pop("routing", None)
    data["extproc"]["max_body_bytes"] = MAX_BODY_BYTES
    return data


def start(workdir: Path):
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    return start_stack(workdir, params_config())


def metric(stack: Any, name: str, labels: dict[str, str]) -> float:
    """The sum of `name`'s samples whose labels include `labels`, from the extproc's /metrics."""
    text = urllib.request.urlopen(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
