"""The `modelyard` command hands each subcommand its own arguments."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelyard.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_route_explain_through_the_cli() -> None:
    r = _run("route", "explain", "--config", str(ROOT / "modelyard.yaml"), "--model", "auto", "--tenant", "demo",
             "--strategy", "cost")
    assert r.returncode == 0, r.stderr
    assert "-> demo-openai-mini" in r.stdout


def test_hash_key_matches_the_demo_config() -> None:
    r = _run("hash-key", "sk-modelyard-demo")
    assert r.stdout.strip() in (ROOT / "modelyard.yaml").read_text()


def test_agent_without_nvml_says_so() -> None:
    r = _run("agent", "--port", "0")
    assert r.returncode == 2
    assert "NVML" in r.stdout + r.stderr


def test_subcommand_help() -> None:
    r = _run("--help")
    assert r.returncode == 0
    for word in ("serve", "up", "envoy", "agent", "route", "ratelimit", "demo", "audit"):
        assert word in r.stdout
