"""`modelyard up` takes every port and path from the config or its flags, prints a banner that
matches the config, and launches only the demo upstreams the config declares.

The first tests check the pure parts (banner, run directory, admin port, which demos); the last
runs the real `modelyard up` on a config in a temporary directory whose only upstream is the
test's own server, from another working directory, and talks to it with the OpenAI SDK.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import openai
import pytest
import yaml

from contracts.config import hash_api_key, load_config, parse_config
from contracts.errors import ConfigError
from controlplane.environments import load_environment
from devstack.banner import DEMO_KEY, KEY_PLACEHOLDER, banner
from devstack.demo import openai_server
from devstack.launcher import demo_children, environment_for, run_dir_for, with_admin_port
from tests.stack_config import free_port
from tests.threaded_app import ThreadedApp

ROOT = Path(__file__).resolve().parents[2]
TEAM_KEY = "sk-team-only-key"


def team_config(upstream_port: int, **devstack: Any) -> dict[str, Any]:
    """An operator's own config: one model on an upstream they run, under a cluster named like a
    demo (the old launcher would have started a demo server on its port), and their own key."""
    return {
        "listener": {"address": "127.0.0.1", "port": free_port()},
        "extproc": {"address": f"127.0.0.1:{free_port()}", "metrics_address": f"127.0.0.1:{free_port()}",
                    "metering_db": "run/metering.sqlite"},
        "models": [{"name": "team-llm", "deployments": [
            {"cluster": "demo-mine", "protocol": "openai", "endpoints": [f"127.0.0.1:{upstream_port}"]}]}],
        "tenants": [{"name": "team", "tier": "L1", "api_keys": [f"sha256:{hash_api_key(TEAM_KEY)}"]}],
        "devstack": devstack,
    }


def test_banner_reflects_the_config() -> None:
    cfg = parse_config(team_config(9))
    text = banner(cfg, url="http://127.0.0.1:1", run_dir="/x/run", admin_url=None, demo_upstreams=[])
    assert "team-llm" in text and '"model":"team-llm"' in text
    assert DEMO_KEY not in text and "demo-gpt" not in text and "Demo upstreams" not in text
    assert f"Bearer {KEY_PLACEHOLDER}" in text
    shipped = load_config(ROOT / "modelyard.yaml")
    text = banner(shipped, url="http://127.0.0.1:1", run_dir="/x/run", admin_url="http://127.0.0.1:9901",
                  demo_upstreams=shipped.devstack.demo_upstreams)
    assert f"Demo API key:   {DEMO_KEY}" in text and f"Bearer {DEMO_KEY}" in text and '"model":"demo-gpt"' in text
    assert "Envoy admin:    http://127.0.0.1:9901" in text
    assert "InferencePool:  http://127.0.0.1:10012 (demo-vllm-pool" in text  # `modelyard epp` and its listener
    # The console and the admin key the README names (docs/console.md); a team config without one says neither.
    assert "Console:        http://127.0.0.1:1/console (sign in with adm-modelyard-demo" in text
    assert "Console" not in banner(cfg, url="http://127.0.0.1:1", run_dir="/x/run", admin_url=None, demo_upstreams=[])


def test_only_declared_clusters_get_demo_servers() -> None:
    assert demo_children(parse_config(team_config(9))) == []  # named demo-*, not declared: not ours
    (child,) = demo_children(parse_config(team_config(9, demo_upstreams=["demo-mine"])))
    assert child.name == "demo-mine@9"
    with pytest.raises(ConfigError, match="demo-typo"):
        demo_children(parse_config(team_config(9, demo_upstreams=["demo-typo"])))
    # The shipped config declares every demo it runs, and every cluster it routes to is served by
    # one of them (demo-pool's two deployments share the demo OpenAI server): `make up` needs nothing else.
    shipped = load_config(ROOT / "modelyard.yaml")
    names = {c.name.split("@")[0] for c in demo_children(shipped)}
    assert names == set(shipped.devstack.demo_upstreams) | {"agent"}
    endpoints = {c: set(d.endpoints) for m in shipped.models for d in m.deployments for c in [d.cluster]}
    served = set().union(*(endpoints[c] for c in shipped.devstack.demo_upstreams))
    assert all(eps <= served for eps in endpoints.values()), endpoints


def test_the_shipped_demos_each_bind_their_own_port() -> None:
    """Every server `make up` starts for the shipped config (demo upstreams, MCP servers, the demo
    scaler) on a port of its own: demo-cold once shared the demo MCP server's, and its first call got
    that server's 404. Deployments may share a demo upstream (demo-pool's two reach demo-openai's)."""
    shipped = load_config(ROOT / "modelyard.yaml")
    owners: dict[int, set[str]] = {}
    for m in shipped.models:
        for d in m.deployments:
            if d.cluster in shipped.devstack.demo_upstreams:
                for e in d.endpoints:
                    owners.setdefault(int(e.rsplit(":", 1)[1]), set()).add(f"demo upstream {d.cluster}")
            if d.scale_from_zero is not None and d.scale_from_zero.webhook:
                owners.setdefault(urlparse(d.scale_from_zero.webhook).port or 80, set()).add("demo scaler")
    for server in shipped.mcp_servers:
        address = server.listen or server.url
        assert address is not None
        port = int(address.rsplit(":", 1)[1]) if server.listen else urlparse(address).port
        owners.setdefault(port or 80, set()).add(f"MCP server {server.name}")
    assert len(owners) > 10
    assert not {p: who for p, who in owners.items() if len(who) > 1}


def test_run_dir_and_admin_port_come_from_config_or_flags(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "modelyard.yaml"
    cfg = parse_config(team_config(9))
    assert run_dir_for(cfg, path) == tmp_path / "conf" / "run"
    assert run_dir_for(parse_config(team_config(9, run_dir="state/up")), path) == tmp_path / "conf" / "state" / "up"
    assert run_dir_for(cfg, path, str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"
    dev = load_environment("dev")
    assert with_admin_port(dev, None) is dev
    moved = with_admin_port(dev, 19901)
    assert moved.admin is not None and (moved.admin.address, moved.admin.port) == ("127.0.0.1", 19901)
    opened = with_admin_port(load_environment("prod"), 0)  # prod closes admin; a flag opens it on loopback
    assert opened.admin is not None and (opened.admin.address, opened.admin.port) == ("127.0.0.1", 0)
    with pytest.raises(ConfigError):
        with_admin_port(dev, 70000)
    # The flag wins over the config's devstack.admin_port, which wins over the environment file.
    from_config = parse_config(team_config(9, admin_port=19903))
    assert environment_for(from_config, "dev").admin.port == 19903
    assert environment_for(from_config, "dev", 19904).admin.port == 19904
    assert environment_for(cfg, "dev").admin.port == dev.admin.port == 9901
    # An environment file of the operator's own, by path.
    own = tmp_path / "edge.yaml"
    own.write_text(yaml.safe_dump({"admin": {"address": "127.0.0.1", "port": 19902}, "concurrency": 1}))
    env = load_environment(str(own))
    assert env.name == "edge" and env.admin is not None and env.admin.port == 19902


def _run_up(argv: list[str], cwd: Path, timeout: float = 120.0) -> tuple[subprocess.Popen, list[str]]:
    """`modelyard up ...` in `cwd`, read until its banner has printed; (process, lines so far)."""
    proc = subprocess.Popen([sys.executable, "-m", "modelyard.cli", "up", *argv], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("Ctrl-C stops everything"):
            return proc, lines
    proc.kill()
    raise AssertionError("modelyard up did not come up:\n" + "\n".join(lines))


def _stop(proc: subprocess.Popen, lines: list[str]) -> int:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    lines.extend(out.splitlines())
    return proc.returncode


@pytest.mark.e2e
@pytest.mark.parametrize("run_dir_flag", [False, True])
def test_up_runs_an_operators_config_from_anywhere(tmp_path: Path, run_dir_flag: bool) -> None:
    conf_dir, elsewhere = tmp_path / "conf", tmp_path / "cwd"
    conf_dir.mkdir()
    elsewhere.mkdir()
    admin_port = free_port()
    # The operator's model server: the demo OpenAI app, run by the test in a thread.
    with ThreadedApp(openai_server.make_app(name="team-server")) as upstream:
        data = team_config(upstream.port)
        (conf_dir / "modelyard.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        argv = ["--config", str(conf_dir / "modelyard.yaml"), "--admin-port", str(admin_port)]
        run_dir = conf_dir / "run"
        if run_dir_flag:
            run_dir = tmp_path / "state"
            argv += ["--run-dir", str(run_dir)]
        proc, lines = _run_up(argv, cwd=elsewhere)
        try:
            text = "\n".join(lines)
            assert "starting 2 processes" in text  # the extproc and Envoy: no demo server, no agent
            assert "Models:         team-llm" in text and '"model":"team-llm"' in text
            assert DEMO_KEY not in text and "demo-gpt" not in text
            assert f"Envoy admin:    http://127.0.0.1:{admin_port}" in text
            assert f"Logs:           {run_dir}" in text
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=5) as r:
                assert r.status == 200  # Envoy's admin is where the flag put it
            url = f"http://127.0.0.1:{data['listener']['port']}"
            client = openai.OpenAI(base_url=f"{url}/v1", api_key=TEAM_KEY, max_retries=0, timeout=30)
            reply = client.chat.completions.create(model="team-llm", messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content.startswith("[team-server]")  # the operator's own server
        finally:
            code = _stop(proc, lines)
    assert code == 0, "\n".join(lines)
    assert sorted(p.name for p in run_dir.glob("*.log")) == ["envoy.log", "extproc.log"]
    assert (run_dir / "envoy-dev.yaml").exists()
    assert list(elsewhere.iterdir()) == []  # nothing written where `up` was started
    # The config's relative metering_db is under the config's directory, not the caller's.
    assert (conf_dir / "run" / "metering.sqlite").exists()
