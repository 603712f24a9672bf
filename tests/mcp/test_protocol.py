"""The MCP gateway's pure parts: JSON-RPC parsing and error shapes, names, merged lists, the
config section, and who may see which tool and which buckets a call charges."""

from __future__ import annotations

import orjson
import pytest

from adapters.mcp import RpcError, error_body, join_name, merge_lists, parse_message, render_error, split_name
from contracts.config import parse_config
from contracts.errors import ConfigError
from extproc.mcp.policy import McpPolicy, ToolCaller
from tests.stack_config import small_config


@pytest.mark.parametrize(("body", "code", "words"), [
    (b"{nope", -32700, "not JSON"),
    (b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600, "batches"),
    (b'"ping"', -32600, "JSON-RPC object"),
    (b'{"id": 1, "method": "ping"}', -32600, '"jsonrpc" must be "2.0"'),
    (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600, "id must be"),
    (b'{"jsonrpc": "2.0", "id": 1}', -32600, '"method" is missing'),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}', -32602, "must be an object"),
])
def test_bad_messages_are_400s_that_say_why(body: bytes, code: int, words: str) -> None:
    with pytest.raises(RpcError) as e:
        parse_message(body)
    assert e.value.status == 400 and e.value.code == code and words in e.value.message


def test_requests_notifications_and_answers() -> None:
    req = parse_message(b'{"jsonrpc": "2.0", "id": "a", "method": "tools/call", "params": {"name": "x"}}')
    assert req.is_request and req.params == {"name": "x"}
    note = parse_message(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    assert not note.is_request and note.id is None
    answer = parse_message(b'{"jsonrpc": "2.0", "id": 3, "result": {}}')
    assert answer.is_response and not answer.is_request


def test_error_shapes() -> None:
    assert orjson.loads(error_body(RpcError(-32601, "Method not found: x", id=4))) == {
        "jsonrpc": "2.0", "id": 4, "error": {"code": -32601, "message": "Method not found: x"}}
    assert orjson.loads(render_error(401, "invalid or missing API key", "authentication_error")) == {
        "jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": "invalid or missing API key",
                                                "data": {"status": 401, "type": "authentication_error"}}}


def test_names_split_at_the_first_separator() -> None:
    assert join_name("notes", "search__all") == "notes__search__all"
    assert split_name("notes__search__all") == ("notes", "search__all")
    assert split_name("search") is None and split_name("__x") is None and split_name("notes__") is None


def test_merged_lists_prefix_every_name_and_drop_what_is_hidden() -> None:
    got = merge_lists("tools/list", [("a", [{"name": "echo", "_meta": {"k": 1}}, {"name": "secret"}, "junk"]),
                                     ("b", [{"name": "echo"}])],
                      lambda server, name: not name.endswith("secret"))
    assert got == {"tools": [{"name": "a__echo", "_meta": {"k": 1, "modelyard/server": "a"}},
                             {"name": "b__echo", "_meta": {"modelyard/server": "b"}}]}


def _config(**mcp: object) -> dict:
    data = small_config()
    data["mcp_servers"] = [{"name": "notes", "url": "http://127.0.0.1:1/mcp", "tools": ["search", "read"]},
                           {"name": "files", "command": ["python", "-m", "x"], "listen": "127.0.0.1:2"}]
    data["mcp"] = {"sessions": "memory", **mcp}
    return data


@pytest.mark.parametrize(("change", "words"), [
    ({"name": "a__b", "url": "http://x/mcp"}, "name"),
    ({"name": "a", "url": "http://x/mcp", "command": ["x"], "listen": "h:1"}, "exactly one of url"),
    ({"name": "a", "command": ["x"]}, "host:port its bridge"),
    ({"name": "a", "url": "ftp://x"}, "http:// or https://"),
])
def test_bad_servers_are_refused_at_load(change: dict, words: str) -> None:
    data = _config()
    data["mcp_servers"].append(change)
    with pytest.raises(ConfigError, match=words):
        parse_config(data)


def test_access_names_known_tenants() -> None:
    with pytest.raises(ConfigError, match="unknown tenant 'nobody'"):
        parse_config(_config(access=[{"tenant": "nobody", "tools": ["*"]}]))


def test_tenant_and_key_lists_narrow_what_a_caller_sees() -> None:
    key = "ab" * 32
    cfg = parse_config(_config(access=[{"tenant": "demo-l3", "tools": ["notes__*"]},
                                       {"key": f"sha256:{key}", "tools": ["notes__search"]}]))
    policy = McpPolicy(cfg.mcp_servers, cfg.mcp)
    anyone, l3, narrowed = ToolCaller("demo", "", None), ToolCaller("demo-l3", "", None), ToolCaller("demo-l3", key, None)
    assert policy.visible(anyone, "notes__search") and policy.visible(anyone, "files__anything")
    assert not policy.visible(anyone, "notes__delete")  # the server exposes search and read only
    assert not policy.visible(anyone, "nobody__search") and not policy.visible(anyone, "search")
    assert policy.visible(l3, "notes__read") and not policy.visible(l3, "files__anything")
    assert policy.visible(narrowed, "notes__search") and not policy.visible(narrowed, "notes__read")
    assert [s.name for s in policy.servers_for(l3)] == ["notes"]
    assert [s.name for s in policy.servers_for(anyone)] == ["notes", "files"]


def test_limits_charge_the_matching_buckets() -> None:
    cfg = parse_config(_config(limits=[{"scope": "tool", "match": "notes__search", "rate": 1, "burst": 2},
                                       {"scope": "tenant", "match": "*", "rate": 5, "burst": 5},
                                       {"scope": "server", "match": "files", "rate": 5, "burst": 5}]))
    policy = McpPolicy(cfg.mcp_servers, cfg.mcp)
    who = ToolCaller("demo", "cd" * 32, None)
    assert [c.key for c in policy.charges(who, "notes", "notes__search")] == [
        "mcp:tool:notes__search:notes__search", "mcp:tenant:*:demo"]
    assert [c.key for c in policy.charges(who, "files", "files__x")] == ["mcp:tenant:*:demo", "mcp:server:files:files"]
