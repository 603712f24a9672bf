"""`extproc.event_loop`: uvloop by default, asyncio on request or where uvloop is missing."""

from __future__ import annotations

import asyncio
import builtins
import logging

import pytest
import uvloop

from contracts.config import parse_config
from extproc.service import loop_factory
from tests.stack_config import demo_config_free_ports


def test_uvloop_is_the_default() -> None:
    cfg = parse_config(demo_config_free_ports()[0])
    assert cfg.extproc.event_loop == "uvloop"
    factory = loop_factory(cfg.extproc.event_loop)
    assert factory is not None
    with asyncio.Runner(loop_factory=factory) as runner:
        assert isinstance(runner.get_loop(), uvloop.Loop)


def test_asyncio_on_request() -> None:
    assert loop_factory("asyncio") is None


def test_missing_uvloop_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    real_import = builtins.__import__

    def no_uvloop(name: str, *args: object, **kwargs: object) -> object:
        if name == "uvloop":
            raise ImportError("no uvloop here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_uvloop)
    with caplog.at_level(logging.WARNING):
        assert loop_factory("uvloop") is None
    assert "uvloop is not installed" in caplog.text
