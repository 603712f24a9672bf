"""Model-based and locale guardrails through a real Envoy with the OpenAI SDK: the gateway's own
/v1/moderations answering as OpenAI's does (the demo moderation upstream); the shipped demo-safety
policy (moderation of prompts, national ids redacted, a language limit); moderation and a signed
webhook on answers, whole and streamed with the hold-back window, a slow webhook failing closed and
open (the anthropic SDK's stream too); the shipped classify policy through the demo Llama-Guard-style
classifier; MCP tools/call arguments and results through the MCP SDK, streamed and whole, and their
verdicts in the mcp_call audit rows.
One stack; the webhook service is a real HTTP server on loopback."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import httpx
import openai
import pytest
import yaml
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import McpError

from tests.conftest import DEMO_KEY
from tests.stack_config import ROOT, _remap, free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
HOOKS: list[dict[str, Any]] = []


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        doc = json.loads(self.rfile.read(int(self.headers["content-length"])))
        HOOKS.append(doc)
        if self.path == "/slow":
            time.sleep(1.5)
        body = json.dumps({"verdict": "block" if "forbidden" in doc.get("text", "") else "allow"}).encode()
        try:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the gateway gave up waiting (the timeout tests)

    def log_message(self, *args: Any) -> None:
        pass


def _alias(name: str, endpoint: str) -> dict[str, Any]:
    """A chat model on the demo-gpt's demo server (a cluster not named demo-*: no second demo process)."""
    return {"name": name, "task_types": ["chat"], "deployments": [
        {"cluster": name, "protocol": "openai", "endpoints": [endpoint]}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    hooks = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hooks.serve_forever, daemon=True).start()
    hook_url = f"http://127.0.0.1:{hooks.server_address[1]}"
    shipped = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data = small_config()
    endpoint = data["models"][0]["deployments"][0]["endpoints"][0]
    moderation = next(m for m in shipped["models"] if m["name"] == "demo-moderation")
    moderation["deployments"][0]["endpoints"] = [f"127.0.0.1:{free_port()}"]
    # The shipped classifier and the model it guards, on demo-gpt's demo server (no key: small_config's has none).
    shipped_alias = [m for m in shipped["models"] if m["name"] in ("demo-llama-guard", "demo-classified")]
    for m in shipped_alias:
        m["deployments"][0].update(endpoints=[endpoint])
        m["deployments"][0].pop("api_key_env")
    data["models"] += [moderation, _alias("demo-guarded", endpoint), _alias("answers", endpoint),
                       _alias("slow-closed", endpoint), _alias("slow-open", endpoint), *shipped_alias]
    assert [p["name"] for p in data["guardrails"]["policies"]] == ["demo-pii", "demo-safety", "demo-tools",
                                                                   "demo-classify"]
    data["extproc"]["audit_db"] = "audit.sqlite"
    mcp = _remap({k: shipped[k] for k in ("mcp_servers", "mcp")}, {})  # the stdio demo server, on a free port
    data.update(mcp_servers=[m for m in mcp["mcp_servers"] if m["name"] == "demo-stdio"], mcp=mcp["mcp"])
    data["devstack"] = {"demo_mcp_servers": []}
    slow = {"type": "webhook", "name": "slow", "url": f"{hook_url}/slow", "direction": "output", "timeout_ms": 300}
    data["guardrails"]["policies"] += [
        {"name": "answers", "applies_to": {"models": ["answers"]}, "window_chars": 32, "checks": [
            {"type": "moderation", "model": "demo-moderation", "direction": "output", "thresholds": {"violence": 0.5}},
            {"type": "webhook", "url": f"{hook_url}/judge", "direction": "output"}]},
        {"name": "slow-closed", "applies_to": {"models": ["slow-closed"]}, "checks": [{**slow, "fail": "closed"}]},
        {"name": "slow-open", "applies_to": {"models": ["slow-open"]}, "checks": [{**slow, "fail": "open"}]},
        {"name": "tool-answers", "applies_to": {"tools": ["demo-stdio__*"]}, "checks": [
            {"type": "moderation", "model": "demo-moderation", "direction": "output", "thresholds": {"violence": 0.5}}]}]
    for p in data["guardrails"]["policies"]:
        if p["name"] == "demo-tools":
            p["applies_to"]["tools"] = ["demo-stdio__echo"]
    try:
        workdir = tmp_path_factory.mktemp("guardrails-models")
        with start_stack(workdir, data) as s:
            s.audit_db = workdir / "audit.sqlite"
            yield s
    finally:
        hooks.shutdown()


def _oa(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=30)


def _ask(stack: Any, model: str, text: str) -> str:
    got = _oa(stack).chat.completions.create(model=model, messages=[{"role": "user", "content": text}])
    return got.choices[0].message.content or ""


def test_the_gateways_moderations_endpoint_answers_as_openais(stack: Any) -> None:
    got = _oa(stack).moderations.create(model="demo-moderation", input="I will kill the process")
    r = got.results[0]
    assert got.model == "demo-moderation" and r.flagged and r.categories.violence and not r.categories.hate
    assert r.category_scores.violence == pytest.approx(0.9) and r.category_applied_input_types.violence == ["text"]
    many = _oa(stack).moderations.create(model="demo-moderation", input=["a calm sentence", "you idiot"])
    assert [x.flagged for x in many.results] == [False, True]
    with pytest.raises(openai.BadRequestError):
        _oa(stack).moderations.create(model="demo-moderation", input=[])
    # No model (OpenAI's default one): the caller's only moderation model stands in, named upstream.
    unnamed = _oa(stack).moderations.create(input="I will kill the process")
    assert unnamed.model == "demo-moderation" and unnamed.results[0].flagged


def test_shipped_safety_policy_moderates_redacts_ids_and_limits_languages(stack: Any) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _ask(stack, "demo-guarded", "explain how to murder a process and kill its children")
    assert "'demo-safety'" in str(e.value) and "'moderation'" in str(e.value) and "murder" not in str(e.value)
    echo = _ask(stack, "demo-guarded", "my ssn is 123-45-6789 and my cpf 529.982.247-25")
    assert "my ssn is [NATIONAL_ID_1] and my cpf [NATIONAL_ID_2]" in echo and "6789" not in echo
    assert "Tisch" in _ask(stack, "demo-guarded", "Ich möchte heute Abend einen Tisch für zwei Personen reservieren.")
    with pytest.raises(openai.BadRequestError, match="'language'"):
        _ask(stack, "demo-guarded", "Пожалуйста, забронируйте столик на двоих сегодня вечером в ресторане.")
    assert "echo: hi" in _ask(stack, "demo-gpt", "hi there, kill it")  # demo-gpt: under no such policy


def test_answers_moderated_and_webhooked_whole_and_streamed(stack: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="'answers'.*'moderation'"):
        _ask(stack, "answers", "they shoot the sheriff")  # the demo echoes it: the answer is what is refused
    with pytest.raises(openai.BadRequestError, match="'webhook'"):
        _ask(stack, "answers", "a forbidden answer")
    assert HOOKS[-1]["direction"] == "output" and "forbidden" in HOOKS[-1]["text"]
    assert "a calm answer" in _ask(stack, "answers", "a calm answer")
    text = "calm words " * 12 + "and then they shoot"
    got: list[str] = []
    with pytest.raises(openai.APIError, match="'moderation'"):
        for c in _oa(stack).chat.completions.create(model="answers", stream=True,
                                                    messages=[{"role": "user", "content": text}]):
            got += [c.choices[0].delta.content or ""] if c.choices else []
    sent = "".join(got)
    assert "calm words calm words" in sent and "shoot" not in sent  # checked segments went out, then the error
    segments = [h for h in HOOKS if h["text"].startswith("[") or "calm" in h["text"]]
    assert len(segments) >= 2 and all(len(h["text"]) < len(text) for h in segments)  # a window at a time
    claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0, timeout=30)
    claude_got: list[str] = []
    with pytest.raises(anthropic.APIError, match="'moderation'"), claude.messages.stream(  # translated, same checks
            model="answers", max_tokens=256, messages=[{"role": "user", "content": text}]) as st:
        claude_got.extend(st.text_stream)
    assert "calm words calm words" in "".join(claude_got) and "shoot" not in "".join(claude_got)


def test_shipped_classify_policy_asks_the_demo_llama_guard(stack: Any) -> None:
    """The shipped demo-classify policy: demo-llama-guard (a chat model of this gateway, asked with the
    operator's prompt) calls a prompt unsafe: a 400 naming the policy and check, never the text."""
    with pytest.raises(openai.BadRequestError) as e:
        _ask(stack, "demo-classified", "how do I murder a houseplant quietly")
    assert e.value.status_code == 400 and "'demo-classify'" in str(e.value) and "'classify'" in str(e.value)
    assert "murder" not in str(e.value)
    assert "echo: water the ferns on Sunday" in _ask(stack, "demo-classified", "water the ferns on Sunday")
    guard = _oa(stack).chat.completions.create(model="demo-llama-guard", messages=[
        {"role": "user", "content": "a counterfeit pipe bomb"}]).choices[0].message.content
    assert guard == "unsafe\nS2,S9"  # the classifier answers as Llama Guard does, called directly too


def test_a_slow_output_webhook_fails_closed_or_open(stack: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="'slow'"):
        _ask(stack, "slow-closed", "hello")
    assert "echo: hello" in _ask(stack, "slow-open", "hello")


def test_mcp_tool_calls_checked_on_arguments_and_results(stack: Any) -> None:
    """The shipped demo-tools policy on demo-stdio__echo (ids redacted, secrets refused) and a moderation
    check on every demo-stdio tool's result, through Envoy with the MCP SDK."""
    async def work(s: ClientSession) -> Any:
        echoed = await s.call_tool("demo-stdio__echo", {"text": "id 123-45-6789 please"})
        try:
            await s.call_tool("demo-stdio__echo", {"text": "key sk-proj-" + "Q" * 24})
            refused = None
        except McpError as e:
            refused = str(e)
        try:
            await s.call_tool("demo-stdio__echo", {"text": "shoot the messenger"})
            violent = None
        except McpError as e:
            violent = str(e)
        return echoed, refused, violent

    async def run() -> Any:
        async with (httpx.AsyncClient(headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as http,
                    streamable_http_client(f"{stack.url}/mcp", http_client=http) as (read, write, _),
                    ClientSession(read, write) as session):
            await session.initialize()
            return await work(session)

    echoed, refused, violent = asyncio.run(asyncio.wait_for(run(), 60))
    assert "[NATIONAL_ID_1]" in echoed.content[0].text and "6789" not in echoed.content[0].text
    assert refused is not None and "'demo-tools'" in refused and "sk-proj" not in refused
    assert violent is not None and "'tool-answers'" in violent and "'moderation'" in violent  # the result refused
    # The same call on the JSON path (no event-stream accepted): answered whole, not relayed.
    json_only = {"authorization": f"Bearer {DEMO_KEY}", "accept": "application/json",
                 "content-type": "application/json"}
    init = httpx.post(f"{stack.url}/mcp", headers=json_only, timeout=20, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
    sid = init.headers["mcp-session-id"]
    whole = httpx.post(f"{stack.url}/mcp", headers={**json_only, "mcp-session-id": sid}, timeout=20, json={
        "jsonrpc": "2.0", "id": 9, "method": "tools/call",
        "params": {"name": "demo-stdio__echo", "arguments": {"text": "json 234-56-7890 stab"}}}).json()
    assert whole["id"] == 9 and "'tool-answers'" in whole["error"]["message"]

    # Every verdict is in its call's mcp_call audit row as the chat flow's rows carry it, never the text
    # (in call order: each row is queued before its answer goes out; workers write in their own batches).
    def rows() -> list[tuple[str, str]]:
        conn = sqlite3.connect(stack.audit_db)
        try:
            return conn.execute("SELECT detail, coalesce(request_body, '') || coalesce(response_body, '') FROM audit "
                                "WHERE event = 'mcp_call' AND model = 'demo-stdio__echo' ORDER BY time").fetchall()
        finally:
            conn.close()

    deadline = time.monotonic() + 10
    while len(rows()) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    got = [json.loads(d).get("guardrails") for d, _ in rows()]
    pii = {"policy": "demo-tools", "check": "national_id", "action": "redact", "direction": "input"}
    secret = {"policy": "demo-tools", "check": "secret", "action": "block", "direction": "input"}
    violence = {"policy": "tool-answers", "check": "moderation", "action": "block", "direction": "output"}
    assert got == [[pii], [secret], [violence], [pii, violence]]  # streamed (the SDK's three), then JSON
    assert all("6789" not in d and "7890" not in d and "sk-proj" not in d for d, _ in rows())
