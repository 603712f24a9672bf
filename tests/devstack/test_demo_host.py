"""Shared demo upstreams (devstack.demo.host): the same demos, on the same ports, in one process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from contracts.config import load_config
from devstack.child import Child
from devstack.demo.host import segments
from devstack.launcher import demo_children
from tests.stack_config import ROOT, free_port

ENV = "DEMO_HOST_TEST_KEY"


def test_shared_demo_children_hold_every_http_demo_of_the_shipped_config() -> None:
    shipped = load_config(ROOT / "modelyard.yaml")
    apart, shared = demo_children(shipped), demo_children(shipped, shared=True)
    host = next(c for c in shared if c.name == "demos")
    folded = [c for c in apart if c.argv[2] != "gpuagent.agent" and c.ready[0] == "http"]
    # One segment per HTTP demo, its own arguments unchanged; ready when the last one answers.
    assert segments(host.argv[3:]) == [(c.argv[2], c.argv[3:]) for c in folded]
    assert host.ready == folded[-1].ready
    # The KServe demos (gRPC, and REST) and the fake agents keep their own processes.
    assert {c.name for c in shared} - {"demos"} == {c.name for c in apart if c not in folded}


def test_one_process_serves_each_demo_on_its_own_port(tmp_path: Path) -> None:
    a, b = free_port(), free_port()
    argv = [sys.executable, "-m", "devstack.demo.host",
            "devstack.demo.openai_server", "--port", str(a), "--name", "demo-a", "--require-key-env", ENV, "--",
            "devstack.demo.anthropic_server", "--port", str(b), "--name", "demo-b"]
    child = Child("demos", argv, ("http", f"http://127.0.0.1:{b}/health"), env={ENV: "sk-host-test"})
    child.spawn(tmp_path)
    try:
        deadline = time.monotonic() + 60  # a bound on a hang, not a speed check
        while not child.is_ready():
            assert child.exit_code() is None and time.monotonic() < deadline, child.log_tail(tmp_path)
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{a}/health").json()["name"] == "demo-a"
        assert httpx.get(f"http://127.0.0.1:{b}/health").json()["name"] == "demo-b"
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"http://127.0.0.1:{a}/v1/chat/completions", json=chat).status_code == 401  # its own key rule
        r = httpx.post(f"http://127.0.0.1:{a}/v1/chat/completions", json=chat,
                       headers={"authorization": "Bearer sk-host-test"})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("[demo-a]")
        r = httpx.post(f"http://127.0.0.1:{a}/v1/embeddings", json={"model": "m", "input": ["x", "y"]},
                       headers={"authorization": "Bearer sk-host-test"})
        assert r.status_code == 200 and len(r.json()["data"]) == 2  # NumPy, loaded on this first use
        r = httpx.post(f"http://127.0.0.1:{b}/v1/messages", json={**chat, "max_tokens": 5})
        assert r.status_code == 200 and r.json()["content"][0]["text"].startswith("[demo-b]")
    finally:
        assert child.proc is not None
        os.kill(child.proc.pid, signal.SIGTERM)
        assert child.proc.wait(timeout=15) == 0  # a clean stop of every demo it holds


def test_a_bad_segment_stops_the_host_with_its_usage_error() -> None:
    r = subprocess.run([sys.executable, "-m", "devstack.demo.host", "devstack.demo.openai_server", "--nope"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--nope" in r.stderr
