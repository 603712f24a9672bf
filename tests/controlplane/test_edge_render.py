"""The edge as rendered per environment: client address trust, slow-client timeouts, connection
limits, the overload manager, admin exposure, extproc mTLS, and credential-free access logs."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest
import yaml

from contracts.config import load_config
from contracts.errors import ConfigError
from controlplane.access_log import JSON_FIELDS, TEXT_FORMAT
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import ENVIRONMENTS_DIR, EnvironmentConfig, load_environment
from devstack.launcher import envoy_binary

ROOT = Path(__file__).resolve().parents[2]


def _boot(env: EnvironmentConfig) -> dict:
    return yaml.safe_load(render_bootstrap(load_config(ROOT / "modelyard.yaml"), env))


def _hcm(boot: dict) -> dict:
    return boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_every_environment_hardens_the_edge(name: str) -> None:
    env = load_environment(name)
    boot = _boot(env)
    hcm = _hcm(boot)
    assert hcm["use_remote_address"] is True
    assert hcm.get("xff_num_trusted_hops", 0) == env.edge.xff_num_trusted_hops
    assert hcm["request_headers_timeout"] == f"{env.edge.request_headers_timeout_s:g}s"
    # Above the extproc's own budget for a request, and never a cap on a stream (it stops at the answer).
    assert float(hcm["request_timeout"].rstrip("s")) > 2 * env.timeouts.extproc_message_s
    assert hcm["common_http_protocol_options"]["max_requests_per_connection"] == env.edge.max_requests_per_connection
    monitors = {m["name"]: m["typed_config"] for m in boot["overload_manager"]["resource_monitors"]}
    assert int(monitors["envoy.resource_monitors.fixed_heap"]["max_heap_size_bytes"]) == env.overload.max_heap_bytes
    assert int(monitors["envoy.resource_monitors.global_downstream_max_connections"][
        "max_active_downstream_connections"]) == env.edge.max_connections
    actions = {a["name"]: a["triggers"][0]["threshold"]["value"] for a in boot["overload_manager"]["actions"]}
    assert actions == {"envoy.overload_actions.shrink_heap": env.overload.shrink_heap_at,
                       "envoy.overload_actions.stop_accepting_requests": env.overload.stop_accepting_requests_at}


def test_prod_has_no_admin_listener() -> None:
    assert "admin" not in _boot(load_environment("prod"))


def test_admin_on_a_unix_socket_validates(tmp_path: Path) -> None:
    env = EnvironmentConfig.model_validate({**load_environment("prod").model_dump(),
                                            "admin": {"pipe": str(tmp_path / "admin.sock")}})
    out = tmp_path / "envoy.yaml"
    out.write_text(render_bootstrap(load_config(ROOT / "modelyard.yaml"), env))
    assert yaml.safe_load(out.read_text())["admin"]["address"]["pipe"] == {"path": str(tmp_path / "admin.sock"),
                                                                          "mode": 0o600}
    v = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr


def test_extproc_mtls_renders_a_verified_h2_client(tmp_path: Path) -> None:
    env = EnvironmentConfig.model_validate({
        "name": "remote", "extproc_endpoints": ["extproc.internal:50051"],
        "extproc_tls": {"ca_file": "/ca.pem", "cert_file": "/envoy.pem", "key_file": "/envoy.key"}})
    extproc = next(c for c in _boot(env)["static_resources"]["clusters"] if c["name"] == "modelyard-extproc")
    ctx = extproc["transport_socket"]["typed_config"]
    assert ctx["sni"] == "extproc.internal"
    assert ctx["common_tls_context"]["alpn_protocols"] == ["h2"]  # gRPC servers require it
    assert ctx["common_tls_context"]["validation_context"]["trusted_ca"] == {"filename": "/ca.pem"}
    assert ctx["common_tls_context"]["tls_certificates"][0]["private_key"] == {"filename": "/envoy.key"}


def test_plaintext_extproc_off_loopback_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    env = EnvironmentConfig.model_validate({"name": "remote", "extproc_endpoints": ["10.1.2.3:50051"]})
    with caplog.at_level(logging.WARNING):
        boot = _boot(env)
    extproc = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "modelyard-extproc")
    assert "transport_socket" not in extproc
    assert any("plaintext" in r.getMessage() and "extproc_tls" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("text,message", [
    ("edge: {request_timeout_s: 15}\ntimeouts: {extproc_message_s: 10}", "edge.request_timeout_s must be 0"),
    ("overload: {shrink_heap_at: 0.95, stop_accepting_requests_at: 0.9}", "overload: Value error, shrink_heap_at"),
    ("extproc_tls: {ca_file: /ca.pem, cert_file: /c.pem}", "extproc_tls: Value error, cert_file and key_file"),
    ("edge: {max_connections: 0}", "edge.max_connections: Input should be greater than or equal to 1"),
    ("edge: {request_header_timeout_s: 5}", "edge.request_header_timeout_s: Extra inputs"),
], ids=[
    "request_timeout-vs-extproc", "overload-order", "extproc_tls-half-pair", "max_connections-0", "misspelt-key"
])
def test_environment_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match="bad.yaml") as e:
        load_environment("bad", tmp_path)
    assert message in str(e.value)


def test_request_timeout_zero_turns_it_off() -> None:
    env = EnvironmentConfig.model_validate({"name": "t", "edge": {"request_timeout_s": 0}})
    assert _hcm(_boot(env)).get("request_timeout", "0s") == "0s"


def test_access_log_formats_name_no_credential() -> None:
    formats = TEXT_FORMAT + " ".join(JSON_FIELDS.values())
    for header in ("authorization", "x-api-key", "x-goog-api-key", "cookie"):
        assert header not in formats.lower()
    assert "%REQ(:PATH)%" not in formats and "ORIGINAL-PATH?:PATH)%" in formats  # only the query-less form


def test_shipped_files_set_the_edge_explicitly() -> None:
    # Operators read these files: each one states its edge and overload budget rather than inheriting it.
    for path in ENVIRONMENTS_DIR.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        assert {"edge", "overload"} <= set(data), path.name
