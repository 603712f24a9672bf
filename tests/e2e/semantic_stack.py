"""A stack config with the shipped semantic model: shared by the semantic cache's e2e tests and the
response cache's Redis replicas test."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.stack_config import ROOT, _remap, small_config

MODEL = "demo-gpt-semantic"


def semantic_config(tmp: Path, **store: object) -> dict:
    """small_config plus the shipped demo-embed and demo-gpt-semantic (ports remapped alike)."""
    shipped = {m["name"]: m for m in yaml.safe_load((ROOT / "modelyard.yaml").read_text())["models"]}
    data = small_config()
    base = data["models"][0]
    base["deployments"][0].pop("warmup", None)  # the upstream's counter counts the tests' calls only
    upstream = base["deployments"][0]["endpoints"][0]
    embed = _remap(shipped["demo-embed"], {})
    # A generous embedding bound: on a busy box a slow embedding is a miss by design, not what is tested.
    semantic = {**base, "name": MODEL, "cache": {**shipped[MODEL]["cache"], "embedding_timeout_ms": 5000}}
    data["models"] += [semantic, embed]
    assert semantic["deployments"][0]["endpoints"] == [upstream]
    data["extproc"]["metering_db"] = str(tmp / "metering.sqlite")
    data["response_cache"] = {"sqlite_path": str(tmp / "rcache.sqlite"), "lookup_timeout_ms": 2000, **store}
    return data
