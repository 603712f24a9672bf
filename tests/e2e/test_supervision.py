"""`modelyard up`'s supervision on a real stack: a demo upstream killed with SIGKILL comes back and
the gateway serves through it again; the only extproc dying means the stack must stop."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from devstack.supervisor import Backoff
from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack

pytestmark = pytest.mark.e2e


def _chat(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                      json={"model": "demo-gpt", "messages": [{"role": "user", "content": "still there?"}]},
                      timeout=10)


def _until(cond, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_dead_demo_upstream_restarts_and_dead_extproc_stops_the_stack(tmp_path: Path) -> None:
    with start_stack(tmp_path, small_config()) as stack:
        demo = next(c for c in stack.children if c.name.startswith("demo-"))
        assert _chat(stack.url).status_code == 200
        lines: list[str] = []
        outcome: list[str | None] = []
        stop = threading.Event()
        sup = threading.Thread(target=lambda: outcome.append(
            stack.supervise(stop.is_set, backoff=Backoff(initial=0.2), log=lines.append)))
        sup.start()
        try:
            old = demo.proc.pid
            os.kill(old, signal.SIGKILL)
            assert _until(lambda: any("restarted" in ln for ln in lines), 10), lines
            assert demo.proc.pid != old and demo.is_ready()
            assert lines[0].startswith(f"modelyard: {demo.name} exited with code -9 (log ")
            assert lines[0].endswith("; restarting in 0.2s")
            r = _chat(stack.url)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "[demo-openai] echo: still there?"

            os.kill(stack.child("extproc").proc.pid, signal.SIGKILL)
            sup.join(10)
            assert not sup.is_alive()
            assert outcome and outcome[0] is not None and outcome[0].startswith("extproc exited with code -9")
            assert lines[-1].endswith("no other replica is alive; stopping")
        finally:
            stop.set()
            sup.join(10)
