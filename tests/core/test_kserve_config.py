"""A KServe deployment the router could never pick (or pick wrongly) is refused at load, with its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contracts.config import parse_config
from contracts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _demo_colors(**changes) -> dict:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    model = next(m for m in data["models"] if m["name"] == "demo-colors")
    model.update(changes)
    return data


@pytest.mark.parametrize("changes,needle", [
    ({"task_types": ["chat"]}, "models[{i}]: Value error, task_types: a KServe model (deployments[0]) needs infer"),
    ({"vision": None}, "vision: image-classification needs the model's vision section"),
], ids=["chat-task-type", "no-vision-section"])
def test_refused_with_the_key_path(changes: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(data := _demo_colors(**changes))
    index = next(i for i, m in enumerate(data["models"]) if m["name"] == "demo-colors")
    assert needle.format(i=index) in str(e.value)


def test_kserve_and_chat_deployments_do_not_mix() -> None:
    data = _demo_colors()
    model = next(m for m in data["models"] if m["name"] == "demo-colors")
    model["deployments"].append({"cluster": "chatty", "protocol": "openai", "endpoints": ["127.0.0.1:1"]})
    with pytest.raises(ConfigError, match=r"deployments\[1\]\.protocol: openai next to KServe deployments\[0\]"):
        parse_config(data)


def test_a_tabular_model_needs_no_vision() -> None:
    parse_config(_demo_colors(task_types=["infer"], vision=None, batching=None,
                              capabilities={"vision": False, "streaming": False}))
