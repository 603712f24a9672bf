"""The adapters' shape (issue 25): one package per protocol behind the old import surface, no file
over 500 lines."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from adapters.protocol import ChatProtocol
from adapters.registry import PROTOCOLS

ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"
MAX_LINES = 500
PACKAGES = ["anthropic", "embeddings", "gemini", "kserve", "openai", "responses"]


def test_no_adapter_file_over_500_lines() -> None:
    sizes = {str(p.relative_to(ADAPTERS)): len(p.read_text().splitlines()) for p in ADAPTERS.rglob("*.py")}
    assert len(sizes) > 40
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}


@pytest.mark.parametrize("name", PACKAGES)
def test_each_protocol_is_a_package_that_exports_its_names(name: str) -> None:
    module = importlib.import_module(f"adapters.{name}")
    assert hasattr(module, "__path__")
    assert module.__all__ and [n for n in module.__all__ if not hasattr(module, n)] == []


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_chat_protocol_packages_carry_every_seam_member(name: str) -> None:
    members = [m for m in dir(ChatProtocol) if not m.startswith("_")]
    assert "parse_request" in members and "StreamDecoder" in members
    assert [m for m in members if m not in PROTOCOLS[name].__all__] == []
