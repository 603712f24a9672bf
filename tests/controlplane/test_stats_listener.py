"""The stats listener against a real Envoy: Prometheus gets /stats/prometheus from another port,
and nothing else of the admin interface is reachable through it."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from contracts.config import ConfigError
from controlplane.environments import EnvironmentConfig
from tests.controlplane.bare_envoy import BareEnvoy
from tests.stack_config import free_port


@pytest.mark.parametrize("admin_kind", ["port", "pipe"])
def test_stats_listener_serves_only_prometheus_stats(tmp_path: Path, admin_kind: str) -> None:
    admin = ({"address": "127.0.0.1", "port": free_port()} if admin_kind == "port"
             else {"pipe": str(tmp_path / "admin.sock")})
    stats_port = free_port()
    env = EnvironmentConfig.model_validate({"name": "stats-test", "admin": admin, "concurrency": 1,
                                            "stats": {"address": "127.0.0.1", "port": stats_port}})
    with BareEnvoy(tmp_path, env):
        base = f"http://127.0.0.1:{stats_port}"
        r = httpx.get(f"{base}/stats/prometheus", timeout=10)
        assert r.status_code == 200
        assert "# TYPE envoy_cluster_upstream_rq_total counter" in r.text
        assert 'envoy_listener_manager_total_listeners_active' in r.text
        # A filter in the query string still reaches the same path.
        filtered = httpx.get(f"{base}/stats/prometheus?filter=server", timeout=10)
        assert filtered.status_code == 200 and "envoy_server_live" in filtered.text
        assert "envoy_cluster_upstream_rq_total" not in filtered.text
        for method, path in (("POST", "/quitquitquit"), ("GET", "/config_dump"), ("POST", "/runtime_modify"),
                             ("POST", "/stats/prometheus"), ("GET", "/stats"), ("GET", "/clusters")):
            denied = httpx.request(method, f"{base}{path}", timeout=10)
            assert denied.status_code == 404, (method, path, denied.text[:200])
        # Still alive: the quit request never reached admin.
        assert httpx.get(f"{base}/stats/prometheus", timeout=10).status_code == 200


def test_stats_without_admin_is_a_config_error() -> None:
    with pytest.raises((ConfigError, ValueError), match="stats proxies the admin interface"):
        EnvironmentConfig.model_validate({"name": "x", "admin": None, "stats": {"port": 9902}})
