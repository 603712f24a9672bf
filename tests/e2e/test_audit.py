"""The audit log through a real Envoy: a row per call from the OpenAI and Anthropic SDKs and per
auth failure, captured bodies redacted and capped, config reloads and limit changes, a chain that
`modelyard audit verify` passes; and SIGTERM with the writer's disk locked and its queue full
loses no row."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml

from extproc.live.reload import APPLIED
from extproc.telemetry.audit_chain import key_id
from tests.conftest import DEMO_KEY
from tests.stack_config import ROOT, small_config, start_stack

pytestmark = pytest.mark.e2e
WRONG_KEY = "sk-not-a-key-of-ours-0000"


def _rows(db: str | Path, where: str = "1", args: tuple = ()) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT * FROM audit WHERE {where} ORDER BY id", args)]
    finally:
        conn.close()


def _until(cond, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelyard.cli", "audit", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


@pytest.mark.timeout(300)
def test_calls_auth_failures_and_reloads_are_audited(tmp_path: Path) -> None:
    data = small_config()
    data["extproc"]["audit_db"] = "audit.sqlite"
    data["tenants"][0]["audit"] = {"capture_bodies": True, "max_body_bytes": 300, "redact": [r"ACCT-\d{6}"]}
    with start_stack(tmp_path, data) as stack:
        db = stack.cfg.extproc.audit_db
        assert db is not None
        oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=30)
        secret_words = f"account ACCT-123456, my gateway key {DEMO_KEY}"
        raw = oa.chat.completions.with_raw_response.create(
            model="demo-gpt", messages=[{"role": "user", "content": secret_words}],
            extra_body={"metadata": {"api_key": "hunter2-in-a-body"}})
        plain_task = raw.headers["x-modelyard-task-id"]
        assert "ACCT-123456" in raw.parse().choices[0].message.content  # the demo echoes: the caller sees it
        with oa.chat.completions.with_streaming_response.create(
                model="demo-gpt", stream=True, messages=[{"role": "user", "content": "x" * 2000}]) as resp:
            stream_task = resp.headers["x-modelyard-task-id"]
            assert "".join(resp.iter_lines())
        claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0, timeout=30)
        msg = claude.messages.with_raw_response.create(model="demo-gpt", max_tokens=64,
                                                       messages=[{"role": "user", "content": "hello from claude"}])
        claude_task = msg.headers["x-modelyard-task-id"]
        assert msg.parse().content[0].text
        # Gemini's key in the query string: the row's path must not carry it.
        g = httpx.post(f"{stack.url}/v1beta/models/demo-gpt:generateContent?key={DEMO_KEY}", timeout=30,
                       json={"contents": [{"role": "user", "parts": [{"text": "gemini says hi"}]}]})
        assert g.status_code == 200, g.text
        gemini_task = g.headers["x-modelyard-task-id"]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{stack.url}/v1", api_key=WRONG_KEY, max_retries=0).chat.completions.create(
                model="demo-gpt", messages=[{"role": "user", "content": "let me in"}])
        r = httpx.post(f"{stack.url}/v1/messages", json={"model": "demo-gpt", "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "no key"}]})
        assert r.status_code == 401

        # SIGHUP with new limits: a reload row and a limits_change row; then a file that does not parse.
        cfg = yaml.safe_load(stack.config_path.read_text())
        cfg["ratelimit"] = {"limits": [{"scope": "tenant", "match": "demo", "rate": 50, "burst": 100}]}
        stack.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        extproc = stack.child("extproc").proc
        os.kill(extproc.pid, signal.SIGHUP)
        assert _until(lambda: len(_rows(db, "event = 'limits_change'")) == 1)
        stack.config_path.write_text("ratelimit: [this is: not, a config")
        os.kill(extproc.pid, signal.SIGHUP)
        assert _until(lambda: len(_rows(db, "event = 'config_reload' AND status = 400")) == 1)

    rows = _rows(db)
    calls = {r["task_id"]: r for r in rows if r["event"] == "call"}
    assert set(calls) == {plain_task, stream_task, claude_task, gemini_task}
    for task, path in ((plain_task, "/v1/chat/completions"), (stream_task, "/v1/chat/completions"),
                       (claude_task, "/v1/messages"), (gemini_task, "/v1beta/models/demo-gpt:generateContent")):
        c = calls[task]
        assert (c["tenant"], c["key_id"], c["method"], c["path"], c["model"], c["cluster"], c["status"]) == (
            "demo", key_id(DEMO_KEY), "POST", path, "demo-gpt", "demo-openai", 200), c
        assert c["input_tokens"] > 0 and c["output_tokens"] > 0
        assert c["client"].startswith("127.0.0.1:")  # Envoy's view of the caller (source.address)
    # Captured bodies: the caller's key, the credential field and the tenant's regex are redacted
    # in both directions; the long prompt is cut at the cap.
    plain = calls[plain_task]
    for body in (plain["request_body"], plain["response_body"]):
        assert "ACCT-123456" not in body and DEMO_KEY not in body and "[REDACTED]" in body
    assert "hunter2" not in plain["request_body"]
    assert "[truncated:" in calls[stream_task]["request_body"]
    assert calls[stream_task]["response_body"].startswith("data: ")  # what the SSE caller got

    failures = [r for r in rows if r["event"] == "auth_failure"]
    assert [(f["status"], f["tenant"], f["key_id"], f["path"]) for f in failures] == [
        (401, "-", key_id(WRONG_KEY), "/v1/chat/completions"), (401, "-", "", "/v1/messages")]
    assert [orjson.loads(f["detail"])["reason"] for f in failures] == ["unknown API key", "missing API key"]
    assert all(f["request_body"] is None for f in failures)

    change = _rows(db, "event = 'limits_change'")[0]
    detail = orjson.loads(change["detail"])
    assert detail["before"]["limits"] == [] and detail["after"]["limits"][0]["match"] == "demo"
    reloads = _rows(db, "event = 'config_reload'")
    # A reload applies the whole config (extproc/live/reload.py): the row lists every part, and which source did it.
    assert [(x["status"], orjson.loads(x["detail"])["applied"]) for x in reloads] == [(200, list(APPLIED)), (400, [])]
    ok, refused = (orjson.loads(x["detail"]) for x in reloads)
    assert ok["source"] == refused["source"] == "sighup" and ok["changes"] == {
        "sections_changed": ["ratelimit"]}
    assert ok["version"] != ok["version_before"] and refused["version_before"] == ok["version"]
    # No key, in any form a caller sent it, anywhere in the log.
    dump = " ".join(str(v) for r in rows for v in r.values())
    assert DEMO_KEY not in dump and WRONG_KEY not in dump

    v = _cli("verify", "--db", str(db))
    assert v.returncode == 0, v.stderr
    assert f"{len(rows)} rows intact" in v.stdout
    ex = _cli("export", "--db", str(db), "--tenant", "demo", "--since", "1h")
    assert ex.returncode == 0, ex.stderr
    assert {orjson.loads(line)["task_id"] for line in ex.stdout.splitlines()} == set(calls)


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.timeout(300)
def test_sigterm_with_a_full_audit_queue_loses_no_row(tmp_path: Path) -> None:
    n = 40
    data = small_config()
    data["extproc"].update(audit_db="audit.sqlite", audit_max_queued=n)
    with start_stack(tmp_path, data) as stack:
        db = stack.cfg.extproc.audit_db
        assert db is not None
        metrics = f"http://{stack.cfg.extproc.metrics_address}/metrics"
        # Another process holds SQLite's write lock: the writer can take nothing until it lets go.
        blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        blocker.execute("BEGIN EXCLUSIVE")
        tasks = []
        try:
            with httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as c:
                for i in range(n):
                    r = c.post("/v1/chat/completions",
                               json={"model": "demo-gpt", "messages": [{"role": "user", "content": f"row {i}"}]})
                    assert r.status_code == 200, r.text
                    tasks.append(r.headers["x-modelyard-task-id"])
                # The queue is full: the gateway fails closed rather than serve a call it cannot record.
                full = c.post("/v1/chat/completions",
                              json={"model": "demo-gpt", "messages": [{"role": "user", "content": "one more"}]})
                assert full.status_code == 503 and full.headers["retry-after"] == "1"
            assert _metric(metrics, "modelyard_audit_queue_rows") == n
            extproc = stack.child("extproc").proc
            extproc.send_signal(signal.SIGTERM)
            time.sleep(5)  # past the unready wait and the stream drain: now it waits on the writer
            assert extproc.poll() is None, "the extproc exited with audit rows unwritten"
        finally:
            blocker.execute("COMMIT")
            blocker.close()
        assert extproc.wait(timeout=90) == 0
    rows = _rows(db)
    assert [r["task_id"] for r in rows] == tasks  # every call, in the order they ended
    assert all(r["status"] == 200 and r["event"] == "call" for r in rows)
    v = _cli("verify", "--db", str(db))
    assert v.returncode == 0, v.stderr


@pytest.mark.timeout(300)
def test_a_call_in_flight_at_sigterm_is_answered_and_recorded(tmp_path: Path) -> None:
    """The drain lets the open stream finish; its row is queued when the stream closes, before
    the writer's final flush."""
    from devstack.demo.faults import SLOW, SLOW_SECONDS

    data = small_config()
    data["extproc"]["audit_db"] = "audit.sqlite"
    result: dict[str, httpx.Response] = {}
    with start_stack(tmp_path, data) as stack:
        db = stack.cfg.extproc.audit_db
        assert db is not None

        def slow_call() -> None:
            result["r"] = httpx.post(f"{stack.url}/v1/chat/completions", timeout=60,
                                     headers={"authorization": f"Bearer {DEMO_KEY}"},
                                     json={"model": "demo-gpt", "stream": True,
                                           "messages": [{"role": "user", "content": f"{SLOW} please"}]})

        t = threading.Thread(target=slow_call)
        t.start()
        time.sleep(1.0)  # the call is upstream now, waiting on the slow demo
        extproc = stack.child("extproc").proc
        extproc.send_signal(signal.SIGTERM)
        t.join(SLOW_SECONDS + 30)
        assert extproc.wait(timeout=60) == 0
    r = result["r"]
    assert r.status_code == 200 and "[DONE]" in r.text
    (row,) = _rows(db, "task_id = ?", (r.headers["x-modelyard-task-id"],))
    assert (row["event"], row["status"], row["cluster"]) == ("call", 200, "demo-openai")
    assert row["output_tokens"] > 0
