"""`extproc.unix_socket`: Envoy reaches a local extproc over its Unix socket, a listed or TLS one over TCP."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from contracts.config import parse_config
from contracts.errors import ConfigError
from contracts.workers import MAX_SOCKET_PATH, worker_socket, worker_sockets
from controlplane.bootstrap import extproc_cluster
from controlplane.environments import EnvironmentConfig, ExtprocTlsSettings

ROOT = Path(__file__).resolve().parents[2]


def _config(**extproc: object):
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["extproc"] = {**data["extproc"], **extproc}
    return parse_config(data)


def _endpoints(cluster) -> list[str]:
    out = []
    for lb in cluster.load_assignment.endpoints[0].lb_endpoints:
        a = lb.endpoint.address
        out.append(f"pipe:{a.pipe.path}" if a.pipe is not None and a.pipe.path
                   else f"{a.socket_address.address}:{a.socket_address.port_value}")
    return out


def test_workers_get_one_socket_each() -> None:
    assert worker_sockets("/run/my/extproc.sock", 3) == ["/run/my/extproc.sock", "/run/my/extproc.sock.1",
                                                         "/run/my/extproc.sock.2"]
    assert worker_socket(None, 2) is None


def test_a_socket_path_past_sun_path_is_refused() -> None:
    with pytest.raises(ConfigError, match="longer than a Unix socket path"):
        worker_socket("/" + "x" * MAX_SOCKET_PATH, 0)


def test_local_extproc_over_its_socket() -> None:
    env = EnvironmentConfig(name="t")
    cluster = extproc_cluster(_config(unix_socket="/tmp/my/extproc.sock", workers=2), env)
    assert _endpoints(cluster) == ["pipe:/tmp/my/extproc.sock", "pipe:/tmp/my/extproc.sock.1"]
    assert cluster.health_checks  # the gRPC health check goes over the socket too


def test_tcp_without_a_socket_for_listed_replicas_and_for_tls() -> None:
    assert _endpoints(extproc_cluster(_config(unix_socket=None, workers=1), EnvironmentConfig(name="t"))) == [
        "127.0.0.1:50051"]
    listed = EnvironmentConfig(name="t", extproc_endpoints=["10.0.0.5:50051"])
    assert _endpoints(extproc_cluster(_config(unix_socket="/tmp/e.sock"), listed)) == ["10.0.0.5:50051"]
    tls = EnvironmentConfig(name="t", extproc_tls=ExtprocTlsSettings(ca_file="/dev/null"))
    assert _endpoints(extproc_cluster(_config(unix_socket="/tmp/e.sock", workers=1), tls)) == ["127.0.0.1:50051"]


def test_the_socket_server_setting_and_the_last_releases_spelling(caplog: pytest.LogCaptureFixture) -> None:
    assert _config().extproc.unix_socket_server == "h2"
    assert _config(unix_socket_server="grpcio").extproc.unix_socket_server == "grpcio"
    with caplog.at_level("WARNING", logger="modelyard.config"):
        assert _config(unix_socket_server="grpclib").extproc.unix_socket_server == "h2"
    assert "grpclib is served by h2 now" in caplog.text
    with pytest.raises(ConfigError):
        _config(unix_socket_server="hyper")
