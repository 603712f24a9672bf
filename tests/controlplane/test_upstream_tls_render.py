"""Upstream TLS as rendered: verified by default, SANs per endpoint kind, mTLS, the loud opt-out,
and config errors that name the key."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.config import parse_config
from contracts.errors import ConfigError
from controlplane import upstream_tls
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import load_environment

ROOT = Path(__file__).resolve().parents[2]


def _config(**deployment: Any) -> dict:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"][0]["deployments"].append({"cluster": "hosted", "protocol": "openai",
                                             "endpoints": ["api.example.com:443"], "tls": True, **deployment})
    return data


def _tls(data: dict) -> dict:
    boot = yaml.safe_load(render_bootstrap(parse_config(data), load_environment("dev")))
    hosted = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "hosted")
    return hosted["transport_socket"]["typed_config"]


def test_verified_by_default_against_the_system_bundle() -> None:
    ctx = _tls(_config())
    assert ctx["sni"] == "api.example.com"
    validation = ctx["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"]["filename"] == upstream_tls.system_ca_bundle()
    assert validation["match_typed_subject_alt_names"] == [{"san_type": "DNS",
                                                            "matcher": {"exact": "api.example.com"}}]
    assert "tls_certificates" not in ctx["common_tls_context"]


def test_ip_endpoint_needs_an_ip_san_and_sends_no_sni() -> None:
    ctx = _tls(_config(endpoints=["10.0.0.7:8443"], tls_ca_file="/etc/modelyard/ca.pem"))
    assert "sni" not in ctx
    validation = ctx["common_tls_context"]["validation_context"]
    assert validation["trusted_ca"]["filename"] == "/etc/modelyard/ca.pem"
    assert validation["match_typed_subject_alt_names"] == [{"san_type": "IP_ADDRESS", "matcher": {"exact": "10.0.0.7"}}]


def test_mtls_presents_the_client_certificate() -> None:
    ctx = _tls(_config(tls_client_cert_file="/c.pem", tls_client_key_file="/k.pem"))
    assert ctx["common_tls_context"]["tls_certificates"] == [
        {"certificate_chain": {"filename": "/c.pem"}, "private_key": {"filename": "/k.pem"}}]
    assert "validation_context" in ctx["common_tls_context"]


def test_insecure_skip_verify_renders_no_validation_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        ctx = _tls(_config(tls_insecure_skip_verify=True))
    assert "validation_context" not in ctx.get("common_tls_context", {})
    assert any("deployment hosted" in r.getMessage() and "NOT verified" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING)


def test_serve_start_warns_about_unverified_upstreams(caplog: pytest.LogCaptureFixture) -> None:
    from extproc.service import warn_unverified_tls

    with caplog.at_level(logging.WARNING):
        warn_unverified_tls(parse_config(_config(tls_insecure_skip_verify=True)))
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "deployment hosted: upstream TLS certificate is NOT verified (tls_insecure_skip_verify)"]


@pytest.mark.parametrize("deployment,message", [
    ({"tls_client_cert_file": "/c.pem"}, "both or neither"),
    ({"tls_client_key_file": "/k.pem"}, "both or neither"),
    ({"tls": False, "tls_ca_file": "/ca.pem"}, "tls_ca_file needs tls: true"),
    ({"tls": False, "tls_insecure_skip_verify": True}, "tls_insecure_skip_verify needs tls: true"),
    ({"tls_insecure_skip_verify": True, "tls_ca_file": "/ca.pem"}, "contradict"),
    ({"tls_verify": False}, "tls_verify: Extra inputs are not permitted"),
], ids=[
    "cert-without-key", "key-without-cert", "ca-without-tls", "skip-verify-without-tls", "skip-verify-with-ca",
    "unknown-key"
])
def test_config_errors_name_the_deployment(deployment: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.deployments\[2\]") as e:
        parse_config(_config(**deployment))
    assert message in str(e.value)


def test_no_system_bundle_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(upstream_tls, "SYSTEM_CA_BUNDLES", (str(tmp_path / "none.crt"),))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.crt"))
    monkeypatch.setattr(upstream_tls.ssl, "get_default_verify_paths",
                        lambda: type("P", (), {"cafile": None})())
    with pytest.raises(ConfigError, match="no system CA bundle found.*tls_ca_file"):
        render_bootstrap(parse_config(_config()), load_environment("dev"))
    # A deployment that names its CA does not need one.
    assert _tls(_config(tls_ca_file="/ca.pem"))["common_tls_context"]["validation_context"]
