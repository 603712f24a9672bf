"""The Gateway API Inference Extension's gateway for the endpoint-picker e2e tests
(tests/e2e/test_endpoint_picker*.py): Envoy's config as the Inference Extension's e2e Envoy has it,
and the calls the tests make through it to demo replicas that say who answered."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai

from devstack.launcher import envoy_binary


def inference_gateway_envoy(listen: int, admin: int, epp: int, pool: list[str]) -> dict[str, Any]:
    """The Inference Extension's Envoy, trimmed to what the protocol needs, plus the subset-hint rule
    and a second way to the pool (`x-test-lb: metadata`): a cluster of the pool's endpoints whose
    override-host policy reads the `envoy.lb` metadata instead of the header, round robin else."""
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [{
                "name": "vllm",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                                 ".HttpConnectionManager",
                        "stat_prefix": "inference",
                        "route_config": {"name": "vllm", "virtual_hosts": [{
                            "name": "vllm-default", "domains": ["*"],
                            "routes": [{"match": {"prefix": "/", "headers": [
                                            {"name": "x-test-lb", "string_match": {"exact": "metadata"}}]},
                                        "route": {"cluster": "pool_by_metadata", "timeout": "60s"}},
                                       {"match": {"prefix": "/"},
                                        "route": {"cluster": "original_destination_cluster", "timeout": "60s"}}]}]},
                        "http_filters": [
                            {"name": "envoy.filters.http.header_to_metadata",
                             "typed_config": {
                                 "@type": "type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3"
                                          ".Config",
                                 "request_rules": [{"header": "x-test-subset", "remove": True, "on_header_present": {
                                     "metadata_namespace": "envoy.lb.subset_hint",
                                     "key": "x-gateway-destination-endpoint-subset", "type": "STRING"}}]}},
                            {"name": "envoy.filters.http.ext_proc",
                             "typed_config": {
                                 "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3"
                                          ".ExternalProcessor",
                                 "grpc_service": {"envoy_grpc": {"cluster_name": "ext_proc"}, "timeout": "10s"},
                                 "processing_mode": {
                                     "request_header_mode": "SEND", "response_header_mode": "SEND",
                                     "request_body_mode": "FULL_DUPLEX_STREAMED",
                                     "response_body_mode": "FULL_DUPLEX_STREAMED",
                                     "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
                                 "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]},
                                                      "receiving_namespaces": {"untyped": ["envoy.lb"]}},
                                 "message_timeout": "30s"}},
                            {"name": "envoy.filters.http.router",
                             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3"
                                                       ".Router", "suppress_envoy_headers": True}}]}}]}]}],
            "clusters": [
                {"name": "original_destination_cluster", "type": "ORIGINAL_DST", "connect_timeout": "2s",
                 "lb_policy": "CLUSTER_PROVIDED",
                 "original_dst_lb_config": {"use_http_header": True,
                                            "http_header_name": "x-gateway-destination-endpoint"}},
                {"name": "pool_by_metadata", "type": "STATIC", "connect_timeout": "2s",
                 "load_balancing_policy": {"policies": [{"typed_extension_config": {
                     "name": "envoy.load_balancing_policies.override_host",
                     "typed_config": {
                         "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3"
                                  ".OverrideHost",
                         "override_host_sources": [{"metadata": {
                             "key": "envoy.lb", "path": [{"key": "x-gateway-destination-endpoint"}]}}],
                         "fallback_policy": {"policies": [{"typed_extension_config": {
                             "name": "envoy.load_balancing_policies.round_robin",
                             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies"
                                                       ".round_robin.v3.RoundRobin"}}}]}}}}]},
                 "load_assignment": {"cluster_name": "pool_by_metadata", "endpoints": [{"lb_endpoints": [
                     {"endpoint": {"address": {"socket_address": {"address": ep.rpartition(":")[0],
                                                                  "port_value": int(ep.rpartition(":")[2])}}}}
                     for ep in pool]}]}},
                {"name": "ext_proc", "type": "STATIC", "connect_timeout": "2s",
                 "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                     "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                     "explicit_http_config": {"http2_protocol_options": {}}}},
                 "load_assignment": {"cluster_name": "ext_proc", "endpoints": [{"lb_endpoints": [{"endpoint": {
                     "address": {"socket_address": {"address": "127.0.0.1", "port_value": epp}}}}]}]}}]}}

def wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}; see {log}")


@contextlib.contextmanager
def gateway_processes(work: Path, demos: list[str], demo_port: int | None, epp_port: int, listen: int) -> Iterator[None]:
    """The demo replicas (`devstack.demo.host` with `demos`), `modelyard epp` (work/epp.yaml) and Envoy
    (work/envoy.yaml), each logging to work/<name>.log, each waited for on its port (the demos' when
    given); all stopped after."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, cmd, port in (
                ("demos", [sys.executable, "-m", "devstack.demo.host", *demos], demo_port),
                ("epp", [sys.executable, "-m", "modelyard.cli", "epp", "--config", str(work / "epp.yaml")], epp_port),
                ("envoy", [envoy_binary(), "-c", str(work / "envoy.yaml"), "--concurrency", "1",
                           "--disable-hot-restart", "--log-level", "warn"], listen)):
            log = work / f"{name}.log"
            with open(log, "wb") as out:
                procs.append(subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT))
            if port is not None:
                wait_port(port, procs[-1], log)
        yield
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=15)


class Gateway:
    def __init__(self, url: str, replicas: list[str]) -> None:
        self.url = url
        self.replicas = replicas


def fake(ep: str, **body: Any) -> None:
    httpx.post(f"http://{ep}/fake-queue", json=body, timeout=5).raise_for_status()


def client(gw: Gateway, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused-by-the-pool", max_retries=0,
                         default_headers=headers or None)


def chat(client: openai.OpenAI, messages: list[dict[str, str]]) -> str:
    raw = client.chat.completions.with_raw_response.create(model="demo", messages=messages)  # type: ignore[arg-type]
    return raw.headers["x-demo-replica"]


def settle(client: openai.OpenAI, expect: str, limit_s: float = 10.0) -> None:
    """Readings arrive every 50 ms: calls until one lands as expected, then the test counts (a
    replica whose /metrics was just switched back on is not ready until its next poll: 503 till then)."""
    deadline = time.monotonic() + limit_s
    while True:
        try:
            if chat(client, [{"role": "user", "content": "settle"}]) == expect:
                return
        except openai.InternalServerError as e:
            assert e.status_code == 503, e
        assert time.monotonic() < deadline, f"never landed on {expect}"
