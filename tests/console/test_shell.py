"""The console's HTTP shell through a `Session` with plain ext_proc messages: off unless configured,
the cookie's attributes (Secure over TLS), sign-in refusals audited as the admin API's, and a key
created from the console audited as the admin API's create."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import yaml

from contracts.config import parse_config
from extproc.gateway import Gateway
from extproc.key_admin import KeyAdmin
from extproc.telemetry.audit import AuditLog
from keys.cache import KeyCache
from keys.secret import digest_of
from tests.keys.session_calls import call_session
from tests.stack_config import ROOT, without_watermarks

ADMIN_KEY = "adm-shell-test"


def _gateway(tmp_path: Path, *, console: bool = True, admin_keys: bool = True) -> Gateway:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)] if admin_keys else []}
    data["console"] = {"enabled": console}
    data["controlplane"] = {**data["controlplane"], "enabled": False}
    cfg = parse_config(data)
    audit = AuditLog(tmp_path / "audit.sqlite")
    return Gateway.build(cfg, audit=audit, key_admin=KeyAdmin(cfg, f"sqlite:///{tmp_path / 'keys.db'}", KeyCache(),
                                                              audit))


def _reply(r: Any) -> tuple[int, dict[str, str], str]:
    assert r.WhichOneof("response") == "immediate_response", r
    ir = r.immediate_response
    return ir.status.code, {h.header.key: h.header.raw_value.decode() or h.header.value
                            for h in ir.headers.set_headers}, ir.body.decode()


async def _post(gw: Gateway, path: str, form: dict[str, str], **headers: str) -> tuple[int, dict[str, str], str]:
    h = {":method": "POST", ":path": path, "content-type": "application/x-www-form-urlencoded", **headers}
    _, r = await call_session(gw, h, urlencode(form).encode())
    return _reply(r)


async def _get(gw: Gateway, path: str, **headers: str) -> tuple[int, dict[str, str], str]:
    _, r = await call_session(gw, {":method": "GET", ":path": path, **headers})
    return _reply(r)


def _audit(tmp_path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(tmp_path / "audit.sqlite")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM audit WHERE event = 'key_admin' ORDER BY id")]
    finally:
        conn.close()


@pytest.mark.parametrize(("console", "admin_keys"), [(False, True), (True, False)])
async def test_the_console_is_any_unknown_url_until_configured(tmp_path: Path, console: bool, admin_keys: bool) -> None:
    gw = _gateway(tmp_path, console=console, admin_keys=admin_keys)
    for path in ("/console", "/console/login", "/console/static/console.css"):
        status, _, body = await _get(gw, path)
        assert status == 404 and "Unknown request URL" in body
    await gw.close()


async def test_sign_in_sets_a_strict_cookie_secure_over_tls_and_audits(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    status, _, body = await _post(gw, "/console/login", {"key": "sk-modelyard-demo"})
    assert status == 401 and "Not an admin key" in body
    status, headers, _ = await _post(gw, "/console/login", {"key": ADMIN_KEY}, **{":scheme": "https"})
    assert status == 303 and headers["location"] == "/console/keys"
    cookie = headers["set-cookie"]
    for attr in ("HttpOnly", "SameSite=Strict", "Secure", "Path=/console"):
        assert attr in cookie
    value = cookie.split(";")[0]
    status, _, page = await _get(gw, "/console/keys", cookie=value)
    assert status == 200 and 'id="create-key"' in page
    token = re.findall(r'name="csrf" value="([^"]+)"', page)[-1]
    status, _, page = await _post(gw, "/console/keys", {"tenant": "demo", "name": "shell", "csrf": token}, cookie=value)
    assert status == 200 and 'id="new-secret"' in page
    created = re.search(r"key_[0-9a-f]{16}", page)
    assert created is not None
    kid = created.group(0)
    _, _, page = await _get(gw, "/console/keys", cookie=value)
    token = re.search(rf'action="/console/keys/{kid}/update"[^>]*><input type="hidden" name="csrf" value="([^"]+)"',
                      page)
    assert token is not None
    status, _, page = await _post(gw, f"/console/keys/{kid}/update", {"models": "demo-mini", "budget_usd": "3",
                                                                      "budget_period": "day", "csrf": token.group(1)},
                                  cookie=value)
    assert status == 200 and f"Updated {kid}" in page and "$3.0 / day" in page
    await gw.close()
    rows = _audit(tmp_path)
    ops = [(r["status"], r["detail"]) for r in rows]
    assert ops[0][0] == 401 and '"auth"' in ops[0][1]
    create = [r for r in rows if '"create"' in r["detail"]]
    assert len(create) == 1 and create[0]["key_id"] == digest_of(ADMIN_KEY)[:12] and create[0]["tenant"] == "demo"
    assert created.group(0) in create[0]["detail"] and "my-" not in str(rows)  # never a secret
    assert [r["status"] for r in rows if '"update"' in r["detail"]] == [200]


async def test_the_key_store_down_is_a_503_never_a_500(tmp_path: Path) -> None:
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)]}
    data["controlplane"] = {**data["controlplane"], "enabled": False}
    cfg = parse_config(data)
    (tmp_path / "not-a-dir").write_text("")  # the store's directory is a file: nothing can open it
    gw = Gateway.build(cfg, key_admin=KeyAdmin(cfg, f"sqlite:///{tmp_path / 'not-a-dir' / 'keys.db'}", KeyCache(), None))
    status, _, body = await _get(gw, "/console/keys", cookie="modelyard_console=x")
    assert status == 503 and "key store" in body
    status, _, body = await _post(gw, "/console/login", {"key": ADMIN_KEY})
    assert status == 503
    await gw.close()
