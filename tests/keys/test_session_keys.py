"""Store keys and the admin API through a `Session` driven with plain ext_proc messages: the same
code Envoy's streams run, on a SQLite store and a real audit log, no sockets."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.key_admin import KeyAdmin
from extproc.telemetry.audit import AuditLog
from extproc.telemetry.audit_chain import key_id
from extproc.telemetry.metering import MeteringStore
from keys.cache import KeyCache
from keys.secret import digest_of
from keys.spec import KeySpec
from ratelimit import Limiter
from tests.keys.session_calls import call_session, chat_call, immediate_reply
from tests.stack_config import ROOT, without_watermarks

ADMIN_KEY = "adm-test-key"


def _gateway(tmp_path: Path, admin_keys: list[str] | None = None, limited: bool = False,
             enforce: str = "extproc") -> Gateway:
    """`limited`: with the rate limiter (the demo config's rules) and a metering store for its decisions."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data.setdefault("ratelimit", {})["enforce"] = enforce
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)] if admin_keys is None else admin_keys}
    cfg = parse_config(data)
    audit = AuditLog(tmp_path / "audit.sqlite")
    admin = KeyAdmin(cfg, f"sqlite:///{tmp_path / 'keys.db'}", KeyCache(), audit)
    if not limited:
        return Gateway.build(cfg, audit=audit, key_admin=admin)
    return Gateway.build(cfg, audit=audit, key_admin=admin, limiter=Limiter(cfg.ratelimit),
                         metering=MeteringStore(tmp_path / "metering.sqlite"))


def _admin(method: str, path: str, key: str | None = ADMIN_KEY) -> dict[str, str]:
    h = {":method": method, ":path": path, "content-type": "application/json"}
    if key:
        h["authorization"] = f"Bearer {key}"
    return h


def _audit_rows(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM audit WHERE event = 'key_admin' ORDER BY id")]
    finally:
        conn.close()


async def test_admin_api_creates_a_key_that_serves_at_once_and_is_audited(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"), orjson.dumps(
        {"tenant": "demo-l3", "models": ["demo-gpt", "demo-claude"], "budget_usd": 2, "budget_period": "day"}))
    status, created = immediate_reply(r)
    assert status == 201 and created["key"].startswith("my-") and created["tenant"] == "demo-l3"
    secret, kid = created["key"], created["id"]

    # The worker that wrote it serves it now; the caller is the key, its tenant narrowed.
    s, r = await call_session(gw, *chat_call(secret))
    assert r.WhichOneof("response") == "request_body"
    assert s.ctx is not None and s.ctx.caller is not None
    assert (s.ctx.caller.key_id, s.ctx.caller.tenant) == (kid, "demo-l3")
    assert s.ctx.caller.budget is not None and s.ctx.caller.budget.usd == 2
    assert s.ctx.tenant is not None and s.ctx.tenant.allowed_models == ["demo-gpt"]

    _, r = await call_session(gw, _admin("GET", "/admin/v1/keys"))
    status, listed = immediate_reply(r)
    assert status == 200 and [k["id"] for k in listed["data"]] == [kid]
    assert secret not in orjson.dumps(listed).decode()

    _, r = await call_session(gw, _admin("POST", f"/admin/v1/keys/{kid}/rotate"))
    status, rotated = immediate_reply(r)
    assert status == 200 and rotated["id"] == kid and rotated["key"] != secret
    _, r = await call_session(gw, *chat_call(secret))
    assert immediate_reply(r)[0] == 401
    _, r = await call_session(gw, *chat_call(rotated["key"]))
    assert r.WhichOneof("response") == "request_body"

    _, r = await call_session(gw, _admin("DELETE", f"/admin/v1/keys/{kid}"))
    assert immediate_reply(r) == (200, {**immediate_reply(r)[1], "status": "revoked"})
    _, r = await call_session(gw, *chat_call(rotated["key"]))
    assert immediate_reply(r)[0] == 401
    _, r = await call_session(gw, _admin("POST", f"/admin/v1/keys/{kid}/rotate"))
    assert immediate_reply(r)[0] == 409
    _, r = await call_session(gw, _admin("POST", "/admin/v1/keys/key_nope/revoke"))
    assert immediate_reply(r)[0] == 404
    await gw.close()

    rows = _audit_rows(tmp_path / "audit.sqlite")
    ops = [(orjson.loads(r["detail"])["op"], r["status"]) for r in rows]
    assert ops == [("create", 201), ("list", 200), ("rotate", 200), ("revoke", 200), ("rotate", 409),
                   ("revoke", 404)]
    assert all(r["key_id"] == digest_of(ADMIN_KEY)[:12] for r in rows)
    assert orjson.loads(rows[0]["detail"])["key"] == kid and rows[0]["tenant"] == "demo-l3"
    everything = b"".join(p.read_bytes() for p in tmp_path.glob("audit.sqlite*"))
    assert secret.encode() not in everything and rotated["key"].encode() not in everything


async def test_admin_api_refuses_other_keys_and_says_why(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    for key in (None, "sk-modelyard-demo", "adm-wrong"):  # a tenant's key is not an admin key
        _, r = await call_session(gw, _admin("GET", "/admin/v1/keys", key))
        status, body = immediate_reply(r)
        assert status == 401 and body["error"]["message"] == "invalid or missing admin key"
    bad = [(orjson.dumps({"tenant": "nobody"}), 400, "unknown tenant 'nobody'"),
           (orjson.dumps({"tenant": "demo", "budget_usd": -1}), 400, "must be a finite amount of 0 or more"),
           (orjson.dumps({"tenant": "demo", "expires": "soon"}), 400, "is neither an ISO 8601 time"),
           (b"[1]", 400, "must be a JSON object"), (b"{oops", 400, "must be a JSON object")]
    for body, code, message in bad:
        _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"), body)
        status, err = immediate_reply(r)
        assert status == code and message in err["error"]["message"], err
    _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"))  # no body at all
    status, err = immediate_reply(r)
    assert status == 400 and "must be a JSON object" in err["error"]["message"]
    _, r = await call_session(gw, _admin("PUT", "/admin/v1/keys"))
    assert immediate_reply(r)[0] == 405
    await gw.close()
    rows = _audit_rows(tmp_path / "audit.sqlite")
    assert [(orjson.loads(r["detail"])["op"], r["status"]) for r in rows][:3] == [("auth", 401)] * 3
    assert rows[1]["key_id"] == key_id("sk-modelyard-demo") and rows[0]["key_id"] == ""
    assert [r["status"] for r in rows[3:]] == [400] * 6 + [405]


async def test_admin_api_is_off_without_admin_keys(tmp_path: Path) -> None:
    gw = _gateway(tmp_path, admin_keys=[])
    _, r = await call_session(gw, _admin("GET", "/admin/v1/keys"))
    status, body = immediate_reply(r)
    assert status == 404 and "Unknown request URL" in body["error"]["message"]
    await gw.close()


@pytest.mark.parametrize("protocol", ["openai", "anthropic"])
async def test_a_model_outside_the_key_reads_as_unknown(tmp_path: Path, protocol: str) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    _, secret = await gw.key_admin.create(KeySpec(tenant="demo", models=("demo-gpt",)))
    _, r = await call_session(gw, *chat_call(secret, "demo-claude", protocol))
    forbidden = immediate_reply(r)
    _, r = await call_session(gw, *chat_call(secret, "demo-nonexistent", protocol))
    unknown = immediate_reply(r)
    assert forbidden[0] == unknown[0] == 404
    assert orjson.dumps(forbidden[1]).replace(b"demo-claude", b"X") == orjson.dumps(unknown[1]).replace(
        b"demo-nonexistent", b"X")
    # And /v1/models lists only what the key may use.
    _, r = await call_session(gw, {":method": "GET", ":path": "/v1/models", "authorization": f"Bearer {secret}"})
    assert [m["id"] for m in immediate_reply(r)[1]["data"]] == ["demo-gpt"]
    await gw.close()


async def test_an_expired_key_is_401_in_the_callers_shape(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    _, secret = await gw.key_admin.create(KeySpec(tenant="demo", expires_at=time.time() + 0.3))
    _, r = await call_session(gw, *chat_call(secret, protocol="anthropic"))
    assert r.WhichOneof("response") == "request_body"
    time.sleep(0.35)
    for protocol in ("openai", "anthropic"):
        _, r = await call_session(gw, *chat_call(secret, protocol=protocol))
        status, body = immediate_reply(r)
        assert status == 401
        if protocol == "anthropic":
            assert body["type"] == "error" and body["error"]["message"] == "API key expired"
        else:
            assert body["error"]["message"] == "API key expired"
    await gw.close()


@pytest.mark.parametrize("enforce", ["extproc", "envoy"])
async def test_a_keys_rpm_refuses_it_alone_in_the_callers_shape(tmp_path: Path, enforce: str) -> None:
    """A key created with `rpm: 2` over the admin API: its third call is a 429 in its protocol with
    `retry-after`, recorded as a decision limited by the key's bucket; the tenant's other key and
    another key of the tenant are still admitted. With `enforce: envoy` (Envoy charges the config's
    rules) the extproc still charges the key's own bucket: only it knows the key."""
    gw = _gateway(tmp_path, limited=True, enforce=enforce)
    _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"), orjson.dumps({"tenant": "demo", "rpm": 2, "tpm": 100000}))
    status, created = immediate_reply(r)
    assert status == 201 and (created["rpm"], created["tpm"]) == (2, 100000)
    secret, kid = created["key"], created["id"]
    for protocol in ("openai", "anthropic"):
        _, r = await call_session(gw, *chat_call(secret, protocol=protocol))
        assert r.WhichOneof("response") == "request_body"
    s, r = await call_session(gw, *chat_call(secret))
    status, body = immediate_reply(r)
    assert status == 429 and f"key:{kid}:requests" in body["error"]["message"]
    assert (body["error"]["type"], body["error"]["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    headers = {h.header.key: h.header.raw_value.decode() for h in r.immediate_response.headers.set_headers}
    # One request back per 30 s (2 a minute, at the buckets' rate resolution of 0.001/s: 0.033/s).
    assert 30 <= int(headers["retry-after"]) <= 31 and headers["x-ratelimit-limit-requests"] == "2"
    _, r = await call_session(gw, *chat_call(secret, protocol="anthropic"))
    status, body = immediate_reply(r)
    assert status == 429 and body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    # Its tenant's config key and a second store key of the tenant are not limited by it.
    _, r = await call_session(gw, *chat_call("sk-modelyard-demo"))
    assert r.WhichOneof("response") == "request_body"
    assert gw.key_admin is not None
    _, other = await gw.key_admin.create(KeySpec(tenant="demo", rpm=2))
    _, r = await call_session(gw, *chat_call(other))
    assert r.WhichOneof("response") == "request_body"
    await gw.close()
    conn = sqlite3.connect(tmp_path / "metering.sqlite")
    rows = conn.execute("SELECT allowed, limited_by, rule, key_id FROM decisions WHERE key_id = ? ORDER BY ts",
                        (kid,)).fetchall()
    conn.close()
    assert rows == [(1, "", "", kid), (1, "", "", kid), (0, f"key:{kid}:requests", f"key:{kid}:requests", kid),
                    (0, f"key:{kid}:requests", f"key:{kid}:requests", kid)]


async def test_the_admin_api_refuses_a_bad_limit(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    for body, message in (({"tenant": "demo", "rpm": 0}, "rpm: must be from 1 to 4500000"),
                          ({"tenant": "demo", "tpm": -5}, "tpm: must be from 1"),
                          ({"tenant": "demo", "rpm": 2.5}, "rpm: expected a whole number"),
                          ({"tenant": "demo", "tpm": "lots"}, "tpm: expected a whole number")):
        _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"), orjson.dumps(body))
        status, reply = immediate_reply(r)
        assert status == 400 and message in reply["error"]["message"], reply
    await gw.close()


async def test_admin_api_narrows_a_key_and_sets_its_budget(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    _, r = await call_session(gw, _admin("POST", "/admin/v1/keys"), orjson.dumps(
        {"tenant": "demo", "models": ["demo-gpt", "demo-mini"]}))
    status, created = immediate_reply(r)
    kid = created["id"]
    _, r = await call_session(gw, _admin("POST", f"/admin/v1/keys/{kid}/update"), orjson.dumps(
        {"models": ["demo-mini"], "budget_usd": 4, "budget_period": "week"}))
    status, view = immediate_reply(r)
    assert status == 200 and view["models"] == ["demo-mini"] and (view["budget_usd"], view["budget_period"]) == (4, "week")
    s, r = await call_session(gw, *chat_call(created["key"]))  # this worker's copy has the change at once
    assert immediate_reply(r)[0] == 404  # demo-gpt: outside the key now, as an unknown model
    s, r = await call_session(gw, *chat_call(created["key"], model="demo-mini"))
    assert s.ctx is not None and s.ctx.caller is not None and s.ctx.caller.budget is not None
    assert s.ctx.caller.budget.usd == 4
    _, r = await call_session(gw, _admin("POST", f"/admin/v1/keys/{kid}/update"), orjson.dumps({"models": ["demo-gpt"]}))
    status, err = immediate_reply(r)
    assert status == 400 and "only narrows" in err["error"]["message"]
    await gw.close()
    ops = [(orjson.loads(r["detail"])["op"], r["status"]) for r in _audit_rows(tmp_path / "audit.sqlite")]
    assert ops == [("create", 201), ("update", 200), ("update", 400)]
