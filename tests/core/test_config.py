"""Config loading: typed objects, and errors that name the key path instead of a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from contracts.config import load_config, parse_config
from contracts.config.ratelimit import RateLimitConfig
from contracts.config.routing import RoutingSettings
from contracts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _demo() -> dict:
    return yaml.safe_load((ROOT / "modelyard.yaml").read_text())


def test_demo_config_loads() -> None:
    cfg = load_config(ROOT / "modelyard.yaml")
    assert cfg.listener.port == 10000
    assert cfg.model("demo-gpt").deployments[0].protocol == "openai"
    assert {t.tier for t in cfg.tenants} == {"L1", "L2", "L3"}


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d["models"][0]["deployments"][0].__setitem__("protocol", "smtp"), "models[0].deployments[0].protocol"),
    (lambda d: d["models"][1].__setitem__("quality", 7), "models[1].quality"),
    (lambda d: d["tenants"][0].__setitem__("api_keys", ["plaintext-key"]), "tenants[0].api_keys"),
    (lambda d: d["listener"].__setitem__("prot", 1), "listener.prot"),
    (lambda d: d["models"][0]["deployments"][0].__setitem__("endpoints", ["nohost"]), "models[0].deployments[0].endpoints"),
    (lambda d: d["models"].append(dict(d["models"][0])), "duplicate"),
    (lambda d: d.pop("tenants"), "tenants"),
], ids=[
    "unknown-protocol", "quality-out-of-range", "plaintext-key", "misspelt-key", "endpoint-without-port",
    "duplicate-model", "no-tenants"
])
def test_bad_config_names_the_key(mutate, expected: str) -> None:
    data = _demo()
    mutate(data)
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.yaml")
    assert expected in str(e.value)


def test_cli_reports_bad_config_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    data = _demo()
    data["models"][0]["deployments"][0]["channel"] = "warp"
    bad.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "modelyard.cli", "serve", "--config", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "models[0].deployments[0].channel" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "x.yaml").write_text("models: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "x.yaml")


@pytest.mark.parametrize("section,value,expected", [
    ("ratelimit", {"limits": [{"scope": "planet", "rate": 1, "burst": 1}]}, "ratelimit.limits[0].scope"),
    ("routing", {"cooldown": {"failures": -1}}, "routing.cooldown.failures"),
], ids=["ratelimit", "routing"])
def test_feature_sections_fail_at_load(section: str, value: dict, expected: str) -> None:
    data = _demo()
    data[section] = value
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.yaml")
    assert expected in str(e.value)


def test_feature_sections_are_typed_once_at_load() -> None:
    data = _demo()
    data["routing"] = {"saturation_threshold": 0.8}
    data["ratelimit"] = {"enforce": "envoy"}
    cfg = parse_config(data, "test.yaml")
    assert isinstance(cfg.routing, RoutingSettings) and cfg.routing.saturation_threshold == 0.8
    assert isinstance(cfg.ratelimit, RateLimitConfig) and cfg.ratelimit.enforce == "envoy"
    data.pop("routing"), data.pop("ratelimit")
    bare = parse_config(data, "test.yaml")
    assert bare.routing == RoutingSettings() and bare.ratelimit == RateLimitConfig()


@pytest.mark.parametrize("value", ["fast please", ["x"], None], ids=["string", "list", "null"])
def test_feature_section_not_a_mapping_names_the_key(value: object) -> None:
    data = _demo()
    data["routing"] = value
    with pytest.raises(ConfigError, match=r"^test\.yaml: routing: "):
        parse_config(data, "test.yaml")


def test_unknown_tenant_strategy_fails_at_load() -> None:
    data = _demo()
    data["tenants"][1]["strategy"] = "nonesuch"
    with pytest.raises(ConfigError) as e:
        parse_config(data, "test.yaml")
    assert str(e.value).startswith("test.yaml: tenants[1].strategy: unknown strategy 'nonesuch' (known: ")
    assert "balanced" in str(e.value)


def test_tenant_strategy_may_name_a_configured_strategy() -> None:
    data = _demo()
    data["tenants"][0]["strategy"] = "pinned"
    data["routing"] = {"strategies": {"pinned": {"quality": 1}}}
    assert parse_config(data, "test.yaml").tenants[0].strategy == "pinned"


def test_cli_refuses_unknown_tenant_strategy_before_starting(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    data = _demo()
    data["tenants"][0]["strategy"] = "nonesuch"
    bad.write_text(yaml.safe_dump(data))
    r = subprocess.run([sys.executable, "-m", "modelyard.cli", "envoy", "render", "--env", "dev", "--config", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "tenants[0].strategy" in r.stderr and "Traceback" not in r.stderr
