from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contracts.config import GatewayConfig, parse_config
from tests.stack_config import ROOT, without_watermarks


@pytest.fixture(scope="session")
def demo_config() -> GatewayConfig:
    return parse_config(without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text())))


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'keys.db'}"
