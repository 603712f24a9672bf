"""`modelyard up`'s supervision on a real stack: a demo upstream killed with SIGKILL comes back and
the gateway serves through it again; a killed extproc is replaced (tests/chaos/test_extproc_crash.py
measures that under load); an extproc that cannot start at all stops the stack, saying why."""

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


def test_dead_demo_upstream_restarts_and_an_extproc_that_cannot_start_stops_the_stack(tmp_path: Path) -> None:
    with start_stack(tmp_path, small_config()) as stack:
        demo = next(c for c in stack.children if c.name.startswith("demo-"))
        extproc = stack.child("extproc")
        assert _chat(stack.url).status_code == 200
        lines: list[str] = []
        outcome: list[str | None] = []
        stop = threading.Event()
        # One failed start is enough here: the standby's (it reads the config when it takes over).
        sup = threading.Thread(target=lambda: outcome.append(
            stack.supervise(stop.is_set, backoff=Backoff(initial=0.2, failed_starts=1), log=lines.append)))
        sup.start()
        try:
            old = demo.proc.pid
            os.kill(old, signal.SIGKILL)
            assert _until(lambda: any("restarted" in ln for ln in lines), 60), lines
            assert demo.proc.pid != old and demo.is_ready()
            assert lines[0].startswith(f"modelyard: {demo.name} exited with code -9 (log ")
            assert lines[0].endswith("; restarting in 0.2s")
            r = _chat(stack.url)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["message"]["content"] == "[demo-openai] echo: still there?"

            assert _until(lambda: extproc.standby is not None, 10), lines
            stack.config_path.write_text("models: [oops\n")  # whoever restarts the extproc now cannot
            os.kill(extproc.proc.pid, signal.SIGKILL)
            sup.join(120)
            assert not sup.is_alive()
            why = outcome[0]
            assert why is not None and why.startswith("extproc exited with code 2 ")
            assert "it cannot start: 1 starts in a row exited before it was ready; its log ends:" in why
            assert "modelyard: configuration error: " in why.split("its log ends:", 1)[1]  # in its own words
            assert lines[-1].endswith("\nmodelyard: stopping")
            assert any(ln.startswith("modelyard: extproc's standby took over") for ln in lines), lines
        finally:
            stop.set()
            sup.join(10)
