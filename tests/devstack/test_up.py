"""`modelyard up`'s exit status follows the supervisor: 1 when the stack could not keep serving."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from devstack import launcher

ROOT = Path(__file__).resolve().parents[2]


class FakeStack:
    """Stands in for Stack: starts nothing, supervises with a canned answer."""

    verdict: str | None = None
    stopped = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.children: list[object] = []
        self.url = "http://127.0.0.1:1"

    def start(self) -> None:
        pass

    def supervise(self, should_stop) -> str | None:
        return FakeStack.verdict

    def stop(self) -> None:
        FakeStack.stopped = True

    def admin_url_if_open(self) -> None:
        return None


@pytest.mark.parametrize("verdict,status", [("envoy exited with code 1", 1), (None, 0)])
def test_up_exits_non_zero_when_the_stack_must_stop(monkeypatch, tmp_path, verdict, status) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "Stack", FakeStack)
    FakeStack.verdict, FakeStack.stopped = verdict, False
    # up() installs its own SIGTERM/SIGINT handlers; the test runner's go back afterwards.
    prev = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        assert launcher.up(str(ROOT / "modelyard.yaml"), "dev") == status
    finally:
        for s, h in prev.items():
            signal.signal(s, h)
    assert FakeStack.stopped
