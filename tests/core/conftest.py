from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contracts.config import parse_config
from extproc.gateway import Gateway
from tests.stack_config import without_watermarks

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gateway() -> Gateway:
    """The demo config's gateway, no watermark agents, in-memory everything."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    return Gateway.build(parse_config(data))
