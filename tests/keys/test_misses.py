"""The miss path: a key the worker's copy does not know is looked up in the store before the 401.
The gate's decisions on a fake clock (pure); then the shell on a real SQLite store, through a
`Session` driven with plain ext_proc messages where the reply's shape matters."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import yaml

from contracts.config import parse_config
from extproc.admission.auth import Identity
from extproc.gateway import Gateway
from extproc.key_admin import KeyAdmin
from keys.cache import KeyCache
from keys.db import connect
from keys.misses import MissGate, Verdict
from keys.record import KeyRecord
from keys.secret import digest_of
from keys.spec import KeySpec
from keys.store import KeyStore
from tests.keys.session_calls import call_session, chat_call, immediate_reply
from tests.stack_config import ROOT, without_watermarks

# -- the gate, pure -------------------------------------------------------------------------------


def test_a_digest_found_absent_is_not_asked_again_within_its_ttl() -> None:
    gate = MissGate(absent_ttl_s=10.0)
    assert gate.check("d", 0.0) is Verdict.ASK
    gate.settled()
    gate.absent("d", 0.0)
    assert gate.check("d", 9.9) is Verdict.ABSENT
    assert gate.check("d", 10.0) is Verdict.ASK  # the TTL is over: asked again


def test_lookups_are_a_token_bucket() -> None:
    gate = MissGate(per_s=2.0, burst=3, max_pending=100)
    assert [gate.check(f"k{i}", 0.0) for i in range(4)] == [Verdict.ASK] * 3 + [Verdict.LIMITED]
    assert gate.check("k4", 0.4) is Verdict.LIMITED  # 0.8 of a token
    assert gate.check("k4", 0.5) is Verdict.ASK
    assert [gate.check(f"j{i}", 100.0) for i in range(4)] == [Verdict.ASK] * 3 + [Verdict.LIMITED]  # at most burst


def test_a_failed_lookup_marks_the_store_down_for_a_while() -> None:
    gate = MissGate(down_s=1.0)
    assert gate.check("a", 0.0) is Verdict.ASK
    gate.failed(0.0)
    gate.settled()
    assert gate.check("b", 0.5) is Verdict.DOWN
    assert gate.check("b", 1.0) is Verdict.ASK  # one probe after the pause


def test_pending_lookups_are_capped() -> None:
    gate = MissGate(max_pending=2)
    assert [gate.check(x, 0.0) for x in "abc"] == [Verdict.ASK, Verdict.ASK, Verdict.DOWN]
    gate.settled()
    assert gate.check("c", 0.0) is Verdict.ASK


def test_the_negative_cache_stays_bounded() -> None:
    gate = MissGate(absent_ttl_s=5.0, max_absent=3)
    for i in range(10):
        gate.absent(f"d{i}", float(i) / 100)
    assert len(gate._absent) == 3 and list(gate._absent) == ["d7", "d8", "d9"]
    gate.absent("late", 6.0)  # everything before expired by now
    assert list(gate._absent) == ["late"]


# -- the shell, on SQLite -------------------------------------------------------------------------


def _gateway(tmp_path: Path, *, read: bool = True, **keys: Any) -> Gateway:
    """`read`: the copy read the store once (a worker serves only after that, or after it failed)."""
    data = without_watermarks(yaml.safe_load((ROOT / "modelyard.yaml").read_text()))
    data["keys"] = {"refresh_s": 3600, **keys}
    cfg = parse_config(data)
    admin = KeyAdmin(cfg, f"sqlite:///{tmp_path / 'keys.db'}", KeyCache(), None)
    if read:
        admin.refresher.refresh_once()
    return Gateway.build(cfg, key_admin=admin)


def _writer(tmp_path: Path) -> KeyStore:
    """Another process's connection: the CLI's."""
    return KeyStore(connect(f"sqlite:///{tmp_path / 'keys.db'}"))


async def test_a_key_written_elsewhere_serves_at_the_first_call(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    rec, secret = _writer(tmp_path).create(KeySpec(tenant="demo", models=("demo-gpt",)))
    assert gw.keyring.identify(secret) is None  # the copy has not read it
    _, r = await call_session(gw, *chat_call(secret))
    assert r.WhichOneof("response") == "request_body"
    assert gw.key_admin.cache.lookup(rec.digest) == rec  # in the copy now: the next call asks nothing
    assert gw.key_admin.cache.version == 0  # and the refresher's own reading point did not move
    await gw.close()


async def test_concurrent_calls_with_one_new_key_share_one_lookup(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    _, secret = _writer(tmp_path).create(KeySpec(tenant="demo"))
    found = await asyncio.gather(*(gw.keyring.look_up(digest_of(secret)) for _ in range(10)))
    assert all(isinstance(f, Identity) for f in found)
    assert gw.key_admin.misses._tokens == gw.key_admin.misses.burst - 1  # one token taken, not ten
    await gw.close()


async def test_an_invalid_key_is_asked_once_then_refused_from_the_negative_cache(tmp_path: Path) -> None:
    gw = _gateway(tmp_path, lookup_burst=2, lookups_per_s=0.001)
    assert gw.key_admin is not None
    for _ in range(5):
        _, r = await call_session(gw, *chat_call("my-nope"))
        assert immediate_reply(r)[0] == 401
    assert gw.key_admin.misses._tokens == 1.0
    _, r = await call_session(gw, *chat_call("my-nope-2"))
    assert immediate_reply(r)[0] == 401
    # Over the budget: the caller's protocol, 503 and retry-after, never a 401 for a key nobody checked.
    _, r = await call_session(gw, *chat_call("my-nope-3", protocol="anthropic"))
    status, body = immediate_reply(r)
    assert status == 503 and body["type"] == "error" and "cannot check this API key" in body["error"]["message"]
    assert ("retry-after", "1") in [(h.header.key, h.header.raw_value.decode())
                                    for h in r.immediate_response.headers.set_headers]
    await gw.close()


async def test_with_the_store_down_cached_keys_serve_and_unknown_ones_get_503(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    _, cached = await gw.key_admin.create(KeySpec(tenant="demo"))
    assert gw.key_admin._lookup_store is None
    # The store's file becomes a directory: every new connection fails (the lookup opens its own).
    for p in tmp_path.glob("keys.db*"):
        p.unlink()
    (tmp_path / "keys.db").mkdir()
    _, r = await call_session(gw, *chat_call("my-unknown"))
    status, body = immediate_reply(r)
    assert status == 503 and "cannot be reached" in body["error"]["message"]
    _, r = await call_session(gw, *chat_call("my-unknown-2"))  # the pause after a failure: refused without a lookup
    assert immediate_reply(r)[0] == 503 and gw.key_admin.misses.pending == 0
    for key in (cached, "sk-modelyard-demo"):  # the copy's keys and the config's are untouched
        _, r = await call_session(gw, *chat_call(key))
        assert r.WhichOneof("response") == "request_body"
    await gw.close()


class _SlowReader(KeyStore):
    """Reads the row, then waits: the revocation and a refresh land between its read and its apply."""

    read = threading.Event()
    go_on = threading.Event()

    def by_digest(self, digest: str) -> KeyRecord | None:
        rec = super().by_digest(digest)
        self.read.set()
        assert self.go_on.wait(10)
        return rec


async def test_a_lookup_older_than_a_revocation_the_copy_has_seen_never_revives_the_key(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    assert gw.key_admin is not None
    admin = gw.key_admin
    admin.open_store = lambda: _SlowReader(connect(f"sqlite:///{tmp_path / 'keys.db'}"))  # type: ignore[method-assign]
    writer = _writer(tmp_path)
    rec, secret = writer.create(KeySpec(tenant="demo"))
    lookup = asyncio.ensure_future(gw.keyring.look_up(digest_of(secret)))
    assert await asyncio.to_thread(_SlowReader.read.wait, 10)  # it read the live row
    revoked = writer.revoke(rec.id)
    admin.cache.apply(writer.changed_since(admin.cache.version))  # a refresh reads the revocation
    _SlowReader.go_on.set()
    assert await lookup is None  # the stale live row did not win
    assert admin.cache.lookup(rec.digest) is None and revoked.version > rec.version
    await gw.close()


async def test_a_revoked_or_expired_key_found_by_lookup_is_refused_as_such(tmp_path: Path) -> None:
    gw = _gateway(tmp_path)
    writer = _writer(tmp_path)
    gone, gone_secret = writer.create(KeySpec(tenant="demo"))
    writer.revoke(gone.id)
    _, old_secret = writer.create(KeySpec(tenant="demo", expires_at=1.0))
    _, r = await call_session(gw, *chat_call(gone_secret))
    assert immediate_reply(r)[0] == 401
    _, r = await call_session(gw, *chat_call(old_secret))
    status, body = immediate_reply(r)
    assert status == 401 and body["error"]["message"] == "API key expired"
    await gw.close()


async def test_a_store_never_read_here_asks_nothing_and_unknown_keys_stay_401(tmp_path: Path) -> None:
    """A host with no store to open (a read-only config directory) serves config-file keys: an unknown
    key is a 401 there, not a 503 for ever."""
    (tmp_path / "keys.db").mkdir()  # no store can open here
    gw = _gateway(tmp_path, read=False)
    assert gw.key_admin is not None
    _, r = await call_session(gw, *chat_call("my-unknown"))
    assert immediate_reply(r)[0] == 401 and gw.key_admin.misses._tokens < 0  # the gate was never asked
    _, r = await call_session(gw, *chat_call("sk-modelyard-demo"))
    assert r.WhichOneof("response") == "request_body"
    await gw.close()
