"""The audit log without Envoy: redaction and the cap (pure), the hash chain catching an edited,
a removed and a reordered row in a real SQLite file, prune keeping the chain verifiable, export,
and the session's rows for a call, an auth failure and a fail-closed backlog."""

from __future__ import annotations

import hashlib
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import yaml

from contracts.config import AuditCapture, parse_config
from contracts.errors import ConfigError
from contracts.when import parse_when
from extproc.gateway import Gateway
from extproc.service import build_routes
from extproc.session import Session
from extproc.telemetry.audit import CALL, AuditEvent, AuditLog, export, prune, verify
from extproc.telemetry.audit_chain import GENESIS, key_id
from extproc.telemetry.redaction import REDACTED, Redactor
from tests.core.session_driver import KEY, body_msg, chat_headers, headers_msg
from tests.stack_config import without_watermarks

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modelyard.cli", "audit", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def _rows(db: Path) -> list[dict]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM audit ORDER BY id")]
    finally:
        conn.close()


def _filled(tmp_path: Path, n: int = 6, t0: float = 1_000.0) -> Path:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(db)
    for i in range(n):
        log.record(AuditEvent(event=CALL, time=t0 + i, task_id=f"task-{i}", tenant="acme", status=200,
                              method="POST", path="/v1/chat/completions", model="m", cluster="c",
                              input_tokens=i, output_tokens=2 * i))
    log.close()
    return db


# ---------------------------------------------------------------- redaction (pure)


def test_credential_fields_and_key_shaped_strings_are_always_redacted() -> None:
    body = orjson.dumps({"model": "m", "api_key": "hunter2", "max_tokens": 50, "metadata": {
        "Authorization": "Bearer abcdefgh12345678", "client_secret": "s3cr3t", "password": "pw", "token": "t0k"},
        "messages": [{"role": "user", "content": "use sk-proj-ABCDEFGHIJKLMNOP and AIzaSyA1234567890abcdefghijklmnopqrstuv"
                                                 " at redis://:topsecret@db:6379/0"}]}).decode()
    out = Redactor().redact(body)
    for secret in ("hunter2", "abcdefgh12345678", "s3cr3t", '"pw"', "t0k", "sk-proj-ABCDEFGHIJKLMNOP",
                   "AIzaSyA1234567890abcdefghijklmnopqrstuv", "topsecret"):
        assert secret not in out, secret
    data = orjson.loads(out)
    assert data["api_key"] == REDACTED and data["max_tokens"] == 50  # a count is not a credential
    assert data["metadata"]["client_secret"] == REDACTED
    assert Redactor().redact("a=1&api_key=zzz&password=yyy") == f"a=1&api_key={REDACTED}&password={REDACTED}"
    assert Redactor().redact("GET /x?key=AIzaSyZZ&alt=sse") == f"GET /x?key={REDACTED}&alt=sse"
    assert Redactor().redact("id AKIAABCDEFGHIJKLMNOP.") == f"id {REDACTED}."
    # Only whole words: an id that merely contains a key's prefix stays readable.
    assert Redactor().redact("task-abcdefghijklmnop x=1 monkey=2") == "task-abcdefghijklmnop x=1 monkey=2"


def test_tenant_regexes_and_the_callers_own_key() -> None:
    r = Redactor([r"ACCT-\d{6}", r"\b\d{3}-\d{2}-\d{4}\b"])
    out = r.redact("account ACCT-123456, ssn 123-45-6789, key my-plain-key", secrets=["my-plain-key"])
    assert out == f"account {REDACTED}, ssn {REDACTED}, key {REDACTED}"


def test_the_cap_cuts_after_redaction_and_says_how_much_there_was() -> None:
    r = Redactor()
    assert r.capture(b"short", 100) == "short"
    text = r.capture(b"x" * 5000, 100)
    assert text == "x" * 100 + "...[truncated: 5000 bytes in all]"
    # A key straddling the cap is redacted whole before the cut, not left half-visible.
    body = b"y" * 95 + b" sk-" + b"A" * 40
    assert "AAAA" not in r.capture(body, 100)
    # A credential field whose value runs past the captured prefix is still redacted.
    long_secret = b'{"api_key": "' + b"S" * 3000 + b'"}'
    assert "SSS" not in r.capture(long_secret[:200], 100, total=len(long_secret))
    # A prefix handed in (the session keeps cap + margin) is marked truncated with the full size.
    assert r.capture(b"abc", 100, total=10_000).endswith("[truncated: 10000 bytes in all]")
    # Multi-byte text is never cut inside a character.
    assert r.capture("é".encode() * 100, 11).startswith("é" * 5 + "...")


def test_a_bad_tenant_regex_fails_at_load() -> None:
    with pytest.raises(ValueError, match="redact\\[0\\] is not a valid regex"):
        AuditCapture(capture_bodies=True, redact=["(unclosed"])
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["tenants"][0]["audit"] = {"capture_bodies": True, "redact": ["[z-a]"]}
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.audit\.redact"):
        parse_config(data)


def test_key_id_is_a_prefix_of_the_configured_digest() -> None:
    assert key_id(KEY) == hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert KEY not in key_id(KEY)


# ---------------------------------------------------------------- the chain in SQLite


def test_an_intact_chain_verifies(tmp_path: Path) -> None:
    db = _filled(tmp_path)
    rows = _rows(db)
    assert [r["id"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[0]["prev_hash"] == GENESIS
    assert all(b["prev_hash"] == a["hash"] for a, b in zip(rows, rows[1:], strict=False))
    report = verify(db)
    assert report.intact and report.rows == 6 and report.head == rows[-1]["hash"]
    r = _cli("verify", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "6 rows intact" in r.stdout


@pytest.mark.parametrize("tamper,bad_row,reason", [
    ("UPDATE audit SET status = 500 WHERE id = 3", 3, "edited"),
    ("UPDATE audit SET tenant = 'other', hash = hash WHERE id = 4", 4, "edited"),
    ("DELETE FROM audit WHERE id = 3", 4, "removed"),
    ("DELETE FROM audit WHERE id IN (1, 2)", 3, "earlier rows were removed"),
    # Swap rows 2 and 3, hashes and all: each sits where the other's predecessor should be.
    ("UPDATE audit SET id = -1 WHERE id = 2; UPDATE audit SET id = 2 WHERE id = 3; "
     "UPDATE audit SET id = 3 WHERE id = -1", 2, "reordered"),
], ids=["status-edited", "tenant-edited-hash-kept", "row-removed", "first-rows-removed", "rows-swapped"])
def test_verify_names_the_first_bad_row(tmp_path: Path, tamper: str, bad_row: int, reason: str) -> None:
    db = _filled(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.executescript(tamper)
    report = verify(db)
    assert not report.intact and report.broken is not None
    assert report.broken.row_id == bad_row
    assert reason in report.broken.reason
    r = _cli("verify", "--db", str(db))
    assert r.returncode == 1
    assert f"BROKEN at row {bad_row}:" in r.stderr


def test_recomputing_one_rows_hash_still_breaks_at_the_next(tmp_path: Path) -> None:
    """An editor who fixes up the edited row's own hash leaves the next row pointing at the old one."""
    from extproc.telemetry.audit_chain import row_hash

    db = _filled(tmp_path)
    row = _rows(db)[2]
    row["status"] = 201
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE audit SET status = 201, hash = ? WHERE id = 3", (row_hash(row["prev_hash"], row),))
    broken = verify(db).broken
    assert broken is not None and broken.row_id == 4


def test_prune_keeps_the_chain_verifiable(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=6, t0=1_000.0)  # rows at t = 1000..1005
    res = prune(db, older_than=1_003.0, now=2_000.0)
    assert (res.pruned_rows, res.first_kept_id) == (3, 4)
    rows = _rows(db)
    assert [r["id"] for r in rows] == [4, 5, 6, 7]
    assert rows[0]["prev_hash"] == res.anchor_hash
    anchor = rows[-1]
    assert anchor["event"] == "prune" and orjson.loads(anchor["detail"])["first_kept_id"] == 4
    assert verify(db).intact
    # The writer appends after the anchor as usual, and the chain still holds.
    log = AuditLog(db)
    log.record(AuditEvent(event=CALL, time=2_001.0, task_id="after"))
    log.close()
    assert _rows(db)[-1]["id"] == 8 and verify(db).intact
    # Removing more of the prefix than the anchor covers is caught.
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit WHERE id = 4")
    broken = verify(db).broken
    assert broken is not None and broken.row_id == 5


def test_prune_of_every_row_and_twice(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=3, t0=1_000.0)
    r = _cli("prune", "--db", str(db), "--older-than", "1d")  # everything is from 1970
    assert r.returncode == 0, r.stderr
    assert "pruned 3 rows" in r.stdout
    rows = _rows(db)
    assert [(x["id"], x["event"]) for x in rows] == [(4, "prune")]
    assert _cli("verify", "--db", str(db)).returncode == 0
    assert "nothing to prune" in _cli("prune", "--db", str(db), "--older-than", "1970-01-01T00:10:00").stdout
    res = prune(db, older_than=10**10)  # the anchor row itself goes; a new one anchors the chain
    assert res.pruned_rows == 1
    assert verify(db).intact and _rows(db)[0]["id"] == 5


def test_export_filters_by_time_and_tenant(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(db)
    for i, tenant in enumerate(["a", "b", "a", "b"]):
        log.record(AuditEvent(event=CALL, time=1_700_000_000.0 + i * 3600, task_id=f"t{i}", tenant=tenant))
    log.close()
    lines = [orjson.loads(x) for x in export(db, since=1_700_000_000.0 + 3600, tenant="a")]
    assert [x["task_id"] for x in lines] == ["t2"]
    r = _cli("export", "--db", str(db), "--since", "2023-11-14T23:00:00Z", "--tenant", "b")
    assert r.returncode == 0, r.stderr
    out = [orjson.loads(x) for x in r.stdout.splitlines()]
    assert [x["task_id"] for x in out] == ["t1", "t3"]
    assert out[0]["time_iso"] == "2023-11-14T23:13:20+00:00" and len(out[0]["hash"]) == 64
    assert _cli("export", "--db", str(db), "--since", "yesterday-ish").returncode == 2


def test_parse_when() -> None:
    assert parse_when("90s", now=1000.0) == 910.0
    assert parse_when("2d", now=200_000.0) == 200_000.0 - 2 * 86400
    assert parse_when("1970-01-02") == 86400.0
    with pytest.raises(ValueError):
        parse_when("soon")


def test_a_locked_database_delays_rows_and_close_writes_them_all(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=1)
    log = AuditLog(db)
    blocker = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the write lock: the disk takes nothing
    for i in range(300):
        log.record(AuditEvent(event=CALL, time=2_000.0 + i, task_id=f"late-{i}"))
    threading.Timer(1.0, lambda: blocker.execute("COMMIT")).start()
    log.close(timeout=30)
    blocker.close()
    rows = _rows(db)
    assert len(rows) == 301 and rows[-1]["task_id"] == "late-299"
    assert verify(db).intact


# ---------------------------------------------------------------- the session's rows


def _audited_gateway(tmp_path: Path, **capture: object) -> tuple[Gateway, AuditLog]:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["tenants"][0]["audit"] = {"capture_bodies": True, "max_body_bytes": 64, **capture}
    cfg = parse_config(data)
    log = AuditLog(tmp_path / "audit.sqlite", captures={t.name: t.audit for t in cfg.tenants}, backlog_limit=50)
    return Gateway.build(cfg, audit=log), log


async def test_session_rows_for_a_call_and_an_auth_failure(tmp_path: Path) -> None:
    gw, log = _audited_gateway(tmp_path, redact=[r"ACCT-\d+"])
    routes = build_routes()
    s = Session(gw, routes)
    await s.handle(headers_msg({**chat_headers(), "x-forwarded-for": "203.0.113.9, 10.0.0.1"}))
    body = orjson.dumps({"model": "demo-gpt", "user": "ACCT-42", "messages": [{"role": "user", "content": KEY}]})
    await s.handle(body_msg(body))
    await s.handle(headers_msg({":status": "200", "content-type": "application/json"}, response=True))
    upstream = orjson.dumps({"id": "x", "object": "chat.completion", "created": 1, "model": "demo-gpt",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok ACCT-42"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    await s.handle(body_msg(upstream, response=True))
    s.close()
    bad = Session(gw, routes)
    r = await bad.handle(headers_msg(chat_headers("sk-wrong-key-123")))
    assert r.immediate_response.status.code == 401
    bad.close()
    await gw.close()
    call, fail = _rows(tmp_path / "audit.sqlite")
    assert (call["event"], call["tenant"], call["model"], call["cluster"], call["status"]) == (
        "call", "demo", "demo-gpt", "demo-openai", 200)
    assert (call["input_tokens"], call["output_tokens"]) == (3, 2)
    assert call["key_id"] == key_id(KEY) and call["client"] == "10.0.0.1"  # the hop Envoy appended
    assert KEY not in call["request_body"] and "ACCT-42" not in call["request_body"] + call["response_body"]
    assert "[truncated:" in call["request_body"]  # 64-byte cap
    assert (fail["event"], fail["tenant"], fail["status"], fail["key_id"]) == (
        "auth_failure", "-", 401, key_id("sk-wrong-key-123"))
    assert orjson.loads(fail["detail"]) == {"reason": "unknown API key"}
    assert fail["request_body"] is None
    assert verify(tmp_path / "audit.sqlite").intact


async def test_a_backlogged_audit_log_refuses_new_calls(tmp_path: Path) -> None:
    gw, log = _audited_gateway(tmp_path)
    blocker = sqlite3.connect(tmp_path / "audit.sqlite", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # the disk is not taking rows
    try:
        for i in range(50):
            log.record(AuditEvent(event=CALL, time=float(i), task_id=f"q{i}"))
        r = await Session(gw, build_routes()).handle(headers_msg(chat_headers()))
        assert r.immediate_response.status.code == 503
        assert ("retry-after", "1") in {(h.header.key, h.header.raw_value.decode())
                                        for h in r.immediate_response.headers.set_headers}
    finally:
        blocker.execute("COMMIT")
        blocker.close()
    await gw.close()
    assert len(_rows(tmp_path / "audit.sqlite")) == 50  # the refused call is counted, not queued


def test_an_audit_db_that_cannot_be_opened_refuses_the_start(tmp_path: Path) -> None:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    (tmp_path / "file").write_text("not a directory")
    data["extproc"]["audit_db"] = str(tmp_path / "file" / "audit.sqlite")
    with pytest.raises(ConfigError, match="extproc.audit_db: cannot open"):
        AuditLog.from_config(parse_config(data))


def test_a_row_sqlite_cannot_bind_is_dropped_alone(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(db)
    log.record(AuditEvent(event=CALL, time=1.0, task_id="before"))
    log.record(AuditEvent(event=CALL, time=2.0, task_id="huge", input_tokens=2**64))
    log.record(AuditEvent(event=CALL, time=3.0, task_id=("not", "text")))  # type: ignore[arg-type]
    log.record(AuditEvent(event=CALL, time=4.0, task_id="after"))
    log.close()
    rows = _rows(db)
    assert [r["task_id"] for r in rows] == ["before", "huge", "after"]
    assert rows[1]["input_tokens"] == 2**63 - 1
    assert verify(db).intact


async def test_a_refused_call_names_the_model_it_asked_for(tmp_path: Path) -> None:
    """A tenant asking for a model it may not use gets the unknown-model 404; the row says which."""
    gw, _ = _audited_gateway(tmp_path)
    s = Session(gw, build_routes())
    await s.handle(headers_msg(chat_headers("sk-modelyard-demo-l3")))  # demo-l3 may use demo-mini, demo-gpt
    r = await s.handle(body_msg(b'{"model": "demo-claude", "messages": [{"role": "user", "content": "x"}]}'))
    assert r.immediate_response.status.code == 404
    s.close()
    await gw.close()
    (row,) = _rows(tmp_path / "audit.sqlite")
    assert (row["event"], row["tenant"], row["model"], row["cluster"], row["status"]) == (
        "call", "demo-l3", "demo-claude", "", 404)


def test_a_recorded_head_catches_a_removed_tail(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=5)
    out = _cli("verify", "--db", str(db)).stdout
    head = out.rsplit("head ", 1)[1].strip()
    assert head.startswith("5:")
    log = AuditLog(db)
    log.record(AuditEvent(event=CALL, time=9_000.0, task_id="later"))
    log.close()
    assert _cli("verify", "--db", str(db), "--expect-head", head).returncode == 0  # it grew: fine
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM audit WHERE id >= 5")  # the chain alone still checks...
    assert _cli("verify", "--db", str(db)).returncode == 0
    r = _cli("verify", "--db", str(db), "--expect-head", head)  # ...the recorded head does not
    assert r.returncode == 1 and "BROKEN at row 5: the recorded head is past the last row" in r.stderr
    # Removed and rewritten: new rows reuse the ids, not the hashes.
    log = AuditLog(db)
    for i in range(3):
        log.record(AuditEvent(event=CALL, time=9_100.0 + i, task_id=f"forged-{i}"))
    log.close()
    r = _cli("verify", "--db", str(db), "--expect-head", head)
    assert r.returncode == 1 and "BROKEN at row 5: the recorded head's hash differs" in r.stderr
    prune(db, older_than=10**10)  # a head from before a prune is vouched for by its anchor
    assert _cli("verify", "--db", str(db), "--expect-head", head).returncode == 0
    assert _cli("verify", "--db", str(db), "--expect-head", "5:nothex").returncode == 2


def test_the_database_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(db)
    log.record(AuditEvent(event=CALL, time=1.0, task_id="t"))
    deadline = time.monotonic() + 10
    while log.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    files = [db, tmp_path / "audit.sqlite-wal", tmp_path / "audit.sqlite-shm"]
    try:
        assert all(f.exists() for f in files)  # the writer holds the database open: WAL files exist
        assert [f.stat().st_mode & 0o777 for f in files] == [0o600] * 3
    finally:
        log.close()


# ---------------------------------------------------------------- the journal: a SIGKILL loses no row

# The child accepts events while its writer gathers for a minute, then SIGKILLs itself: no commit.
_KILLED_CHILD = """
import os, signal, sys
from extproc.telemetry import audit
audit._GATHER_S = 60.0
log = audit.AuditLog(sys.argv[1])
for i in range(int(sys.argv[2])):
    log.record(audit.AuditEvent(event=audit.CALL, time=2_000.0 + i / 3, task_id=f"lost-{i}", tenant="acme",
                                status=200, method="POST", path="/v1/chat/completions", model="m", cluster="c",
                                input_tokens=i, output_tokens=1, detail={"route": "r", "n": i}))
log.record(audit.AuditEvent(event=audit.CONFIG_RELOAD, time=3_000.0, detail={"ok": True}))
os.kill(os.getpid(), signal.SIGKILL)
"""


def _killed_child(db: Path, n: int) -> None:
    r = subprocess.run([sys.executable, "-c", _KILLED_CHILD, str(db), str(n)], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, r.stderr


def _journal_files(db: Path) -> list[Path]:
    return sorted(p for p in db.parent.glob(f"{db.name}.journal.*") if not p.name.endswith(".lock"))


def test_rows_accepted_before_a_sigkill_are_chained_on_at_the_next_start(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=3)
    _killed_child(db, 200)
    assert len(_rows(db)) == 3  # the writer never committed
    AuditLog(db).close()
    rows = _rows(db)
    assert [r["task_id"] for r in rows] == [*(f"task-{i}" for i in range(3)), *(f"lost-{i}" for i in range(200)), ""]
    assert rows[3 + 7]["detail"] == '{"n":7,"route":"r"}' and rows[3 + 7]["time"] == 2_000.0 + 7 / 3
    assert rows[-1]["event"] == "config_reload"
    report = verify(db)
    assert report.intact and report.rows == 204
    r = _cli("verify", "--db", str(db))
    assert r.returncode == 0 and "204 rows intact" in r.stdout, r.stdout + r.stderr
    assert _journal_files(db) == []


def test_replaying_the_same_audit_journal_twice_chains_each_row_once(tmp_path: Path) -> None:
    db = _filled(tmp_path, n=2)
    _killed_child(db, 40)
    saved = {p: p.read_bytes() for p in _journal_files(db)}
    assert saved
    AuditLog(db).close()
    for p, data in saved.items():  # as if the replaying process died before it truncated the journal
        p.write_bytes(data)
    AuditLog(db).close()
    rows = _rows(db)
    assert [r["task_id"] for r in rows] == ["task-0", "task-1", *(f"lost-{i}" for i in range(40)), ""]
    assert verify(db).intact


def test_a_journaled_row_keeps_no_body_and_no_key(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite"
    log = AuditLog(db, captures={"acme": AuditCapture(capture_bodies=True)})
    secret = "sk-journal-secret-0123456789"
    log.record(AuditEvent(event=CALL, time=1.0, task_id="t", tenant="acme", request_body=f'{{"k":"{secret}"}}'.encode(),
                          request_size=30, secrets=(secret,)))
    assert all(secret.encode() not in p.read_bytes() for p in _journal_files(db))
    log.close()
