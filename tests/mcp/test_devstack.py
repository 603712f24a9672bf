"""`modelyard up` and MCP: the shipped config's stdio server gets its bridge and its HTTP demo a
demo server; a demo name no url entry has is refused; the banner says where /mcp is."""

from __future__ import annotations

import pytest

from contracts.config import load_config, parse_config
from contracts.errors import ConfigError
from devstack.banner import banner
from devstack.launcher import mcp_children
from tests.stack_config import ROOT, small_config


def test_the_shipped_config_runs_a_bridge_and_the_http_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEMO_MCP_TOKEN", "Bearer x")
    shipped = load_config(ROOT / "modelyard.yaml")
    demo, bridge, issuer = mcp_children(shipped, "py")  # config order, then the demo OAuth issuer
    assert issuer.name == "mcp-oauth" and issuer.ready == ("http", "http://127.0.0.1:8140/health")
    assert issuer.argv[2:] == ["devstack.demo.oauth_server", "--host", "127.0.0.1", "--port", "8140",
                               "--resource", "http://127.0.0.1:10000/mcp"]
    assert bridge.name == "mcp-demo-stdio" and bridge.argv[:5] == ["py", "-m", "devstack.mcp_bridge", "--listen",
                                                                   "127.0.0.1:8132"]
    assert bridge.argv[6:] == ["python", "-m", "devstack.demo.mcp_stdio_server"]
    assert demo.name == "mcp-demo-http" and demo.ready == ("http", "http://127.0.0.1:8131/health")
    assert demo.argv[-2:] == ["--require-token-env", "DEMO_MCP_TOKEN"]  # the demo checks what the gateway injects
    assert [c.name for c in mcp_children(shipped, "py", demos=False)] == ["mcp-demo-stdio"]  # a bridge is not a demo
    text = banner(shipped, url="http://127.0.0.1:1", run_dir="/x", admin_url=None, demo_upstreams=[])
    assert "MCP servers:    demo-http, demo-stdio as one, at http://127.0.0.1:1/mcp" in text


def test_a_demo_mcp_server_must_be_a_url_entry() -> None:
    data = small_config()
    data["mcp_servers"] = [{"name": "local", "command": ["x"], "listen": "127.0.0.1:9"}]
    data["devstack"] = {"demo_mcp_servers": ["local", "typo"]}
    with pytest.raises(ConfigError, match="'local', 'typo'"):
        mcp_children(parse_config(data))
