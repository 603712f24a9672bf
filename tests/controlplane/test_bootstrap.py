"""Every shipped environment renders a bootstrap that Envoy itself accepts."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from contracts.config import load_config, parse_config
from contracts.errors import ConfigError
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import ENVIRONMENTS_DIR, load_environment
from devstack.launcher import envoy_binary

ROOT = Path(__file__).resolve().parents[2]
ENVS = sorted(p.stem for p in ENVIRONMENTS_DIR.glob("*.yaml"))


def test_shipped_environments() -> None:
    assert {"dev", "staging", "prod"} <= set(ENVS)


@pytest.mark.parametrize("env", ENVS)
def test_envoy_validates(env: str, tmp_path: Path) -> None:
    out = tmp_path / f"{env}.yaml"
    r = subprocess.run(["modelyard", "envoy", "render", "--env", env, "--config", str(ROOT / "modelyard.yaml"),
                        "-o", str(out)], capture_output=True, text=True, timeout=60,
                       env={"PATH": str(Path(envoy_binary()).parent) + ":/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    v = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "OK" in v.stdout + v.stderr


def _ext_proc(hcm: dict) -> dict:
    return next(f["typed_config"] for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")


def test_render_contract() -> None:
    boot = yaml.safe_load(render_bootstrap(load_config(ROOT / "modelyard.yaml"), load_environment("staging")))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    names = [f["name"] for f in hcm["http_filters"]]
    # Bodies are inflated before the extproc reads them; answers compressed after it wrote them.
    assert names == [*(f"envoy.filters.http.decompressor.{e}" for e in ("gzip", "br", "zstd")),
                     *(f"envoy.filters.http.compressor.{e}" for e in ("br", "gzip")),
                     "envoy.filters.http.ext_proc", "envoy.filters.http.ratelimit", "envoy.filters.http.router"]
    # The extproc may set x-envoy-upstream-rq-timeout-ms (a deployment's timeout_ms): Envoy drops it otherwise.
    assert _ext_proc(hcm)["mutation_rules"]["allow_envoy"] is True
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert routes[0]["route"]["cluster_header"] == "x-modelyard-cluster"
    assert boot["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] == 32 * 1024 * 1024
    clusters = {c["name"]: c for c in boot["static_resources"]["clusters"]}
    assert "typed_extension_protocol_options" in clusters["demo-kserve"]  # gRPC upstream: HTTP/2
    assert "typed_extension_protocol_options" in clusters["modelyard-extproc"]


def test_ext_proc_message_timeout_covers_the_longest_queue_wait() -> None:
    """A queued request's body reply comes when it gets a slot: Envoy must wait that long for it."""
    cfg = load_config(ROOT / "modelyard.yaml")  # demo-mini: max_inflight 4, L1 waits up to 30 s
    env = load_environment("staging")
    boot = yaml.safe_load(render_bootstrap(cfg, env))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    timeout = _ext_proc(hcm)["message_timeout"]
    assert float(timeout.rstrip("s")) == env.timeouts.extproc_message_s + 30
    # Translation hops never queue: their filters keep the plain message timeout (a gRPC bridge has none).
    for hop in boot["static_resources"]["listeners"][1:]:
        hop_hcm = hop["filter_chains"][0]["filters"][0]["typed_config"]
        if hop["name"].startswith("grpcbridge~"):
            continue
        assert float(_ext_proc(hop_hcm)["message_timeout"].rstrip("s")) == \
            env.timeouts.extproc_message_s


def test_queue_wait_past_the_edge_request_timeout_is_refused() -> None:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    mini = next(m for m in data["models"] if m["name"] == "demo-mini")["deployments"][0]
    mini["queue"]["max_wait_s"] = {"L1": 120}
    from contracts.config import parse_config

    with pytest.raises(ConfigError, match="request_timeout_s"):
        render_bootstrap(parse_config(data), load_environment("dev"))  # dev cuts requests at 60 s


def test_unknown_environment() -> None:
    with pytest.raises(ConfigError, match="no such environment"):
        load_environment("moon")


def test_tls_and_dns_upstreams_validate(tmp_path: Path) -> None:
    """A hosted API: TLS with SNI to a DNS name (STRICT_DNS), credential from an env var."""
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"][0]["deployments"].append({
        "cluster": "hosted-openai", "protocol": "openai", "endpoints": ["api.example.com:443"], "tls": True,
        "api_key_env": "OPENAI_API_KEY", "upstream_model": "gpt-4o-mini"})
    from contracts.config import parse_config

    out = tmp_path / "tls.yaml"
    out.write_text(render_bootstrap(parse_config(data), load_environment("prod")))
    boot = yaml.safe_load(out.read_text())
    hosted = next(c for c in boot["static_resources"]["clusters"] if c["name"] == "hosted-openai")
    assert hosted["type"] == "STRICT_DNS"
    tls = hosted["transport_socket"]["typed_config"]
    assert tls["sni"] == "api.example.com"
    assert tls["common_tls_context"]["validation_context"]["trusted_ca"]["filename"]  # verified by default
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"]["auto_host_rewrite"] is True
    v = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(out)], capture_output=True, text=True,
                       timeout=60)
    assert v.returncode == 0, v.stdout + v.stderr


def _main_routes(cfg) -> list[dict]:
    boot = yaml.safe_load(render_bootstrap(cfg, load_environment("staging")))
    hcm = boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    return hcm["route_config"]["virtual_hosts"][0]["routes"]


def test_duplex_bodies_ride_on_routes_matched_before_the_cluster_is_picked() -> None:
    shipped = load_config(ROOT / "modelyard.yaml")
    assert shipped.extproc.bodies == "duplex"
    routes = _main_routes(shipped)
    duplex = [r for r in routes if "typed_per_filter_config" in r]
    assert {r["match"]["path"] for r in duplex} >= {"/v1/chat/completions", "/v1/messages", "/v1/responses"}
    assert routes[0]["route"]["cluster_header"] == "x-modelyard-cluster"  # a picked cluster matches first
    assert "prefix" in routes[-1]["match"] and routes[-1]["direct_response"]["status"] == 404
    for r in duplex:
        assert r["direct_response"]["status"] == 404  # nothing picked: as the catch-all
        # a compressed body stays buffered (a duplex body ended by the decompressor's trailers is lost)
        assert r["match"]["headers"] == [{"name": "content-encoding", "present_match": True, "invert_match": True}]
        over = r["typed_per_filter_config"]["envoy.filters.http.ext_proc"]["overrides"]
        mode = over["processing_mode"]
        assert mode["request_body_mode"] == mode["response_body_mode"] == "FULL_DUPLEX_STREAMED"
        assert mode["request_trailer_mode"] == mode["response_trailer_mode"] == "SEND"
        meta = {m["key"]: m["value"] for m in over["grpc_initial_metadata"]}
        assert meta == {"x-modelyard-bodies": "duplex", "x-modelyard-buffer-limit": str(32 * 1024 * 1024)}
    # unset: the four-message design on every path (an extproc of an earlier release reads no duplex)
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    del data["extproc"]["bodies"]
    assert not [r for r in _main_routes(parse_config(data)) if "typed_per_filter_config" in r]
