"""deploy/prometheus with promtool (Debian's prometheus package): the config and rules check, and
the rule unit tests show each alert firing on the series that should page and staying quiet otherwise."""

from __future__ import annotations

import subprocess

from tests.deploy.tools import tool
from tests.stack_config import ROOT

PROMETHEUS_DIR = ROOT / "deploy/prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120, cwd=PROMETHEUS_DIR)


def test_promtool_checks_config_and_rules() -> None:
    rules = _promtool("check", "rules", "modelyard.rules.yml")
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 24 rules found" in rules.stdout
    config = _promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


def test_promtool_rule_unit_tests_pass() -> None:
    out = _promtool("test", "rules", "modelyard.rules.test.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
