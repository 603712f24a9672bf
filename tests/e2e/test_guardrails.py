"""Guardrails through a real Envoy with the OpenAI and Anthropic SDKs and a Gemini-shaped call: the
shipped demo policy (input redaction the demo upstream echoes back, an output block), input blocks
in each protocol, a redaction that round-trips (whole and streamed), a stream ended mid-way with an
error event the SDK raises, and a log verdict in the audit row and the metric. One stack."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.conftest import DEMO_KEY
from tests.stack_config import small_config, start_stack

pytestmark = pytest.mark.e2e
L2_KEY = "sk-modelyard-demo-l2"
SECRET = "sk-proj-" + "Q" * 24
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    data = small_config()
    data["extproc"]["audit_db"] = "audit.sqlite"
    assert data["guardrails"]["policies"][0]["applies_to"] == {"tenants": ["demo-l2"]}  # the shipped demo policy
    data["guardrails"]["policies"].append({
        "name": "e2e", "applies_to": {"tenants": ["demo"]}, "window_chars": 32, "checks": [
            {"type": "email", "action": "redact", "restore": True},
            {"type": "secret", "action": "block"},
            {"type": "phone", "action": "log"},
            {"type": "regex", "name": "forbidden", "pattern": "FORBIDDEN-[0-9]+", "direction": "output"},
            {"type": "json_schema", "name": "structured", "direction": "output"}]})
    with start_stack(tmp_path_factory.mktemp("guardrails"), data) as s:
        yield s


def _oa(stack: Any, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=30)


def _claude(stack: Any, key: str = DEMO_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0, timeout=30)


def _gemini(stack: Any, text: str, key: str = DEMO_KEY, stream: bool = False) -> httpx.Response:
    verb = "streamGenerateContent?alt=sse" if stream else "generateContent"
    return httpx.post(f"{stack.url}/v1beta/models/demo-gpt:{verb}", headers={"x-goog-api-key": key}, timeout=30,
                      json={"contents": [{"role": "user", "parts": [{"text": text}]}]})


def test_shipped_demo_policy_redacts_input_the_echo_shows(stack: Any) -> None:
    text = "mail ana@example.com, card 4111 1111 1111 1111, again ana@example.com"
    got = _oa(stack, L2_KEY).chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": text}])
    echo = got.choices[0].message.content or ""
    assert "mail [EMAIL_1], card [CARD_1], again [EMAIL_1]" in echo and "ana@" not in echo  # no restore here
    msg = _claude(stack, L2_KEY).messages.create(model="demo-gpt", max_tokens=64,
                                                 messages=[{"role": "user", "content": text}])
    assert "[EMAIL_1]" in msg.content[0].text and "4111" not in msg.content[0].text  # type: ignore[union-attr]
    big = "filler " * 4000 + text  # past the inline limit: checked in a worker thread, the same outcome
    got = _oa(stack, L2_KEY).chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": big}])
    assert (got.choices[0].message.content or "").endswith("mail [EMAIL_1], card [CARD_1], again [EMAIL_1]")
    with pytest.raises(openai.BadRequestError) as e:
        _oa(stack, L2_KEY).chat.completions.create(
            model="demo-gpt", messages=[{"role": "user", "content": "say MODELYARD-DEMO-SECRET-42"}])
    assert "demo-pii" in str(e.value) and "demo-secret" in str(e.value) and "SECRET-42" not in str(e.value)


def test_input_block_in_each_protocol(stack: Any) -> None:
    with pytest.raises(openai.BadRequestError) as oe:
        _oa(stack).chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": f"key {SECRET}"}])
    with pytest.raises(anthropic.BadRequestError) as ae:
        _claude(stack).messages.create(model="demo-gpt", max_tokens=16,
                                       messages=[{"role": "user", "content": f"key {SECRET}"}])
    g = _gemini(stack, f"key {SECRET}")
    assert g.status_code == 400 and g.json()["error"]["status"] == "INVALID_ARGUMENT"
    with pytest.raises(openai.BadRequestError) as re_:  # the Responses API
        _oa(stack).responses.create(model="demo-gpt", input=f"key {SECRET}")
    for said in (str(oe.value), str(ae.value), g.text, str(re_.value)):
        assert "'e2e'" in said and "'secret'" in said and SECRET not in said


def test_redaction_round_trips_whole_and_streamed(stack: Any) -> None:
    text = "write to bob@example.org about it"
    whole = _oa(stack).chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": text}])
    assert "write to bob@example.org about it" in (whole.choices[0].message.content or "")
    msg = _claude(stack).messages.create(model="demo-gpt", max_tokens=64, messages=[{"role": "user", "content": text}])
    assert "bob@example.org" in msg.content[0].text  # type: ignore[union-attr]
    streamed = "".join(c.choices[0].delta.content or "" for c in _oa(stack).chat.completions.create(
        model="demo-gpt", stream=True, messages=[{"role": "user", "content": text}]) if c.choices)
    assert "write to bob@example.org about it" in streamed and "[EMAIL" not in streamed
    with _claude(stack).messages.stream(model="demo-gpt", max_tokens=64,
                                        messages=[{"role": "user", "content": text}]) as s:
        assert "bob@example.org" in "".join(s.text_stream)
    g = _gemini(stack, text)
    assert g.status_code == 200 and "bob@example.org" in g.json()["candidates"][0]["content"]["parts"][0]["text"]
    assert "bob@example.org" in _oa(stack).responses.create(model="demo-gpt", input=text).output_text
    gs = _gemini(stack, text, stream=True)
    assert gs.status_code == 200 and "bob@example.org" in gs.text and "[EMAIL" not in gs.text


def test_stream_blocked_mid_way_ends_with_an_error_event(stack: Any) -> None:
    text = "word " * 30 + "FORBIDDEN-7 and more words after it"
    got: list[str] = []
    raw = _oa(stack).chat.completions.with_raw_response.create(model="demo-gpt", stream=True,
                                                               messages=[{"role": "user", "content": text}])
    with pytest.raises(openai.APIError) as e:
        for c in raw.parse():
            got += [c.choices[0].delta.content or ""] if c.choices else []
    sent = "".join(got)
    assert "word word" in sent and "FORBIDDEN" not in sent  # text before the match went out, then the error
    assert "'forbidden'" in str(e.value)
    # Metered for what was sent (4 characters a token), not for what the upstream made.
    row = _row_of(stack, raw.headers["x-modelyard-task-id"])
    assert row["status"] == 400 and row["output_tokens"] == -(-len(sent) // 4)
    claude_got: list[str] = []
    with pytest.raises(anthropic.APIError), _claude(stack).messages.stream(
            model="demo-gpt", max_tokens=256, messages=[{"role": "user", "content": text}]) as s:
        claude_got.extend(s.text_stream)
    assert "word word" in "".join(claude_got) and "FORBIDDEN" not in "".join(claude_got)
    g = _gemini(stack, text, stream=True)
    assert g.status_code == 200 and "'forbidden'" in g.text and "FORBIDDEN-7" not in g.text


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]


def test_tool_call_arguments_are_checked_whole_and_streamed(stack: Any) -> None:
    ask = [{"role": "user", "content": "weather in FORBIDDEN-9"}]  # the demo calls the tool with the last word
    with pytest.raises(openai.BadRequestError, match="forbidden"):
        _oa(stack).chat.completions.create(model="demo-gpt", messages=ask, tools=TOOLS)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="forbidden"):
        for _ in _oa(stack).chat.completions.create(model="demo-gpt", messages=ask, tools=TOOLS,  # type: ignore[arg-type]
                                                    stream=True):
            pass
    ok = [{"role": "user", "content": "weather in Paris"}]
    calls: dict[int, str] = {}
    for c in _oa(stack).chat.completions.create(model="demo-gpt", messages=ok, tools=TOOLS,  # type: ignore[arg-type]
                                                stream=True):
        for tc in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            calls[tc.index] = calls.get(tc.index, "") + (tc.function.arguments or "" if tc.function else "")
    assert orjson.loads(calls[0]) == {"city": "Paris"}


def test_structured_output_checked_against_the_requested_schema(stack: Any) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}
    with pytest.raises(openai.BadRequestError, match="structured"):  # the demo echoes prose, not the JSON asked for
        _oa(stack).chat.completions.create(model="demo-gpt", messages=MSG, response_format=fmt)  # type: ignore[arg-type]
    with pytest.raises(openai.APIError, match="structured"):
        for _ in _oa(stack).chat.completions.create(model="demo-gpt", messages=MSG, response_format=fmt,  # type: ignore[arg-type]
                                                    stream=True):
            pass
    assert _oa(stack).chat.completions.create(model="demo-gpt", messages=MSG).choices[0].message.content


def _rows(db: str) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM audit WHERE event = 'call' ORDER BY id")]
    finally:
        conn.close()


def _row_of(stack: Any, task: str) -> dict[str, Any]:
    """The call's audit row, once the writer thread has it."""
    row: dict[str, Any] = {}
    deadline = time.monotonic() + 20
    while not row and time.monotonic() < deadline:
        row = next((r for r in _rows(stack.cfg.extproc.audit_db) if r["task_id"] == task), {})
        time.sleep(0.1)
    return row


def test_log_verdict_is_an_audit_row_and_a_metric(stack: Any) -> None:
    raw = _oa(stack).chat.completions.with_raw_response.create(
        model="demo-gpt", messages=[{"role": "user", "content": "call me at +1 415 555 0100"}])
    assert "+1 415 555 0100" in (raw.parse().choices[0].message.content or "")  # log: the call goes on
    row = _row_of(stack, raw.headers["x-modelyard-task-id"])
    detail = orjson.loads(row["detail"])
    assert detail["guardrails"] == [{"policy": "e2e", "check": "phone", "action": "log", "direction": "input"}]
    assert "415" not in row["detail"]
    # A block's row too (this test's own call: the module's tests may run on separate stacks under xdist).
    blocked = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                         json={"model": "demo-gpt", "messages": [{"role": "user", "content": SECRET}]}, timeout=30)
    assert blocked.status_code == 400
    row = _row_of(stack, blocked.headers["x-modelyard-task-id"])
    assert row["status"] == 400 and SECRET not in row["detail"]
    assert orjson.loads(row["detail"])["guardrails"] == [{"policy": "e2e", "check": "secret", "action": "block",
                                                          "direction": "input"}]
    metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=10).text
    assert ('modelyard_guardrail_verdicts_total{action="log",check="phone",direction="input",policy="e2e"}'
            in metrics)
    assert 'modelyard_guardrail_verdicts_total{action="block",check="secret",direction="input",policy="e2e"}' in metrics
