"""The key store on SQLite, its in-memory copy and the refresh that keeps it current; the key ring
that reads it on the request path."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from contracts.config import GatewayConfig, parse_config
from contracts.config.keys import Budget
from contracts.errors import ConfigError
from extproc.admission.auth import EXPIRED, AdminKeys, Identity, KeyRing
from keys.cache import KeyCache
from keys.db import StoreError, connect
from keys.location import store_dsn
from keys.refresher import KeyRefresher
from keys.secret import SECRET_PREFIX, digest_of
from keys.spec import KeySpec, KeySpecError, build_change, build_spec, change_from_json, parse_expiry, spec_from_json
from keys.store import KeyStore, RevokedKey, UnknownKey


def _store(dsn: str) -> KeyStore:
    return KeyStore(connect(dsn))


def test_create_stores_only_the_digest(sqlite_dsn: str, tmp_path: Path) -> None:
    store = _store(sqlite_dsn)
    rec, secret = store.create(KeySpec(tenant="demo", name="ci", models=("demo-gpt",), budget_usd=5.0,
                                       budget_period="week"))
    store.close()
    assert secret.startswith(SECRET_PREFIX) and len(secret) > 40
    assert rec.digest == digest_of(secret) and rec.id.startswith("key_")
    assert rec.budget == Budget(usd=5.0, period="week")
    # Nowhere in the file (tables, WAL) is the secret, nor any of its long substrings.
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("keys.db*"))
    assert secret.encode() not in raw and secret[3:20].encode() not in raw
    assert digest_of(secret).encode() in raw
    row = sqlite3.connect(tmp_path / "keys.db").execute("SELECT * FROM keys").fetchone()
    assert secret not in repr(row)


def test_rotate_replaces_the_secret_and_revoke_ends_the_key(sqlite_dsn: str) -> None:
    store = _store(sqlite_dsn)
    rec, old = store.create(KeySpec(tenant="demo"))
    rotated, new = store.rotate(rec.id)
    assert rotated.id == rec.id and new != old
    assert rotated.digest == digest_of(new) and rotated.version > rec.version
    revoked = store.revoke(rec.id)
    assert revoked.status() == "revoked" and revoked.revoked_at is not None
    assert store.revoke(rec.id).version == revoked.version  # twice: a no-op, not a new change
    with pytest.raises(RevokedKey):
        store.rotate(rec.id)
    with pytest.raises(UnknownKey):
        store.revoke("key_nope")
    with pytest.raises(UnknownKey):
        store.rotate("key_nope")
    assert [r.id for r in store.list()] == [rec.id]
    assert store.list("demo-l2") == []


def test_changed_since_returns_rows_in_write_order(sqlite_dsn: str) -> None:
    store = _store(sqlite_dsn)
    a, _ = store.create(KeySpec(tenant="demo"))
    b, _ = store.create(KeySpec(tenant="demo-l2"))
    store.revoke(a.id)
    rows = store.changed_since(0)
    assert [r.id for r in rows] == [b.id, a.id]  # a's latest change comes last
    assert [r.version for r in rows] == sorted(r.version for r in rows)
    assert store.changed_since(rows[-1].version) == []


def test_concurrent_writers_get_distinct_versions(sqlite_dsn: str) -> None:
    """Two connections (a CLI and the admin API) writing at once: every write its own version."""
    stores = [_store(sqlite_dsn), _store(sqlite_dsn)]

    def write(store: KeyStore) -> None:
        for _ in range(15):
            store.create(KeySpec(tenant="demo"))

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    versions = [r.version for r in stores[0].changed_since(0)]
    assert len(versions) == 30 and len(set(versions)) == 30


def test_db_layer_runs_one_sql_text_for_a_table_of_its_own(sqlite_dsn: str) -> None:
    """keys/db.py is for other tables too (a spend ledger): batches, transactions, rollbacks."""
    db = connect(sqlite_dsn)
    db.execute("CREATE TABLE IF NOT EXISTS ledger (key_id TEXT NOT NULL, usd DOUBLE PRECISION NOT NULL)")
    with db.transaction():
        db.executemany("INSERT INTO ledger (key_id, usd) VALUES (?, ?)", [("a", 0.5), ("a", 0.25), ("b", 1.0)])
    with pytest.raises(RuntimeError), db.transaction():
        db.execute("INSERT INTO ledger (key_id, usd) VALUES (?, ?)", ("a", 100.0))
        raise RuntimeError("rolled back")
    assert db.fetchall("SELECT key_id, SUM(usd) FROM ledger GROUP BY key_id ORDER BY key_id") == [
        ("a", 0.75), ("b", 1.0)]
    assert db.fetchone("SELECT COUNT(*) FROM ledger WHERE key_id = ?", ("zzz",)) == (0,)
    with pytest.raises(StoreError):
        db.execute("SELECT * FROM no_such_table")
    db.close()


def test_cache_follows_changes() -> None:
    cache = KeyCache()
    store = KeyStore(connect("sqlite:///:memory:"))
    rec, secret = store.create(KeySpec(tenant="demo"))
    assert cache.apply(store.changed_since(cache.version)) == 1
    assert cache.lookup(digest_of(secret)) == rec and len(cache) == 1
    rotated, new = store.rotate(rec.id)
    cache.apply(store.changed_since(cache.version))
    assert cache.lookup(digest_of(secret)) is None
    assert cache.lookup(digest_of(new)) == rotated
    # An admin write applied early moves no version: rows others wrote before it are still read.
    other, other_secret = store.create(KeySpec(tenant="demo"))
    revoked = store.revoke(rec.id)
    cache.apply([revoked], advance=False)
    assert cache.lookup(digest_of(new)) is None and cache.version == rotated.version
    cache.apply(store.changed_since(cache.version))
    assert cache.lookup(digest_of(other_secret)) == other and cache.by_id(rec.id) is None
    # An older copy of a row never overwrites a newer one.
    cache.apply([rotated])
    assert cache.lookup(digest_of(new)) is None


def test_refresher_picks_up_another_writers_change_within_its_period(sqlite_dsn: str) -> None:
    cache = KeyCache()
    refresher = KeyRefresher(lambda: _store(sqlite_dsn), cache, 0.05)
    refresher.start()
    try:
        assert refresher.wait_loaded(5)
        writer = _store(sqlite_dsn)  # another process's connection, as the CLI's is
        rec, secret = writer.create(KeySpec(tenant="demo"))
        deadline = time.monotonic() + 2
        while cache.lookup(digest_of(secret)) is None:
            assert time.monotonic() < deadline, "a created key was not seen within 2 s"
            time.sleep(0.01)
        writer.revoke(rec.id)
        deadline = time.monotonic() + 2
        while cache.lookup(digest_of(secret)) is not None:
            assert time.monotonic() < deadline, "a revoked key was still served after 2 s"
            time.sleep(0.01)
    finally:
        refresher.stop()


def test_refresher_keeps_the_last_keys_when_the_store_fails(tmp_path: Path) -> None:
    cache = KeyCache()
    opened = []

    def open_store() -> KeyStore:
        opened.append(1)
        if len(opened) > 1:
            raise StoreError("down")
        return _store(f"sqlite:///{tmp_path / 'k.db'}")

    refresher = KeyRefresher(open_store, cache, 60)
    store = _store(f"sqlite:///{tmp_path / 'k.db'}")
    _, secret = store.create(KeySpec(tenant="demo"))
    refresher.refresh_once()
    assert cache.lookup(digest_of(secret)) is not None
    refresher._store.db.close()  # type: ignore[union-attr]  # the connection breaks under it
    refresher._store.db.dsn = "sqlite:////nonexistent-dir/x/keys.db"  # type: ignore[union-attr]
    with pytest.raises(StoreError):
        refresher.refresh_once()
    with pytest.raises(StoreError):
        refresher.refresh_once()  # reopening fails too
    assert cache.lookup(digest_of(secret)) is not None  # the last copy still serves


def test_a_start_waits_no_longer_once_the_first_read_failed(tmp_path: Path) -> None:
    (tmp_path / "ro").write_text("a file where the store's directory would be")
    refresher = KeyRefresher(lambda: _store(f"sqlite:///{tmp_path / 'ro' / 'keys.db'}"), KeyCache(), 60)
    refresher.start()
    try:
        t0 = time.monotonic()
        assert refresher.wait_loaded(30) is False
        assert time.monotonic() - t0 < 10
    finally:
        refresher.stop()


# -- the spec: what the CLI and the admin API accept --------------------------------------------------


def test_spec_checks_every_field(demo_config: GatewayConfig) -> None:
    now = 1_800_000_000.0
    spec = build_spec(demo_config, tenant="demo", models="demo-gpt, demo-mini,demo-gpt", budget_usd="2.5",
                      budget_period="day", expires="2030-01-01T00:00:00Z", now=now)
    assert spec.models == ("demo-gpt", "demo-mini") and spec.budget_usd == 2.5 and spec.budget_period == "day"
    assert spec.expires_at == 1_893_456_000.0
    assert build_spec(demo_config, tenant="demo", budget_usd=0).budget_period == "month"
    assert build_spec(demo_config, tenant="demo", models=["auto"]).models == ("auto",)  # a group name
    bad = [({"tenant": "nope"}, "unknown tenant 'nope'"),
           ({"tenant": ""}, "tenant: required"),
           ({"tenant": "demo", "budget_usd": "-1"}, "budget_usd: must be a finite amount of 0 or more"),
           ({"tenant": "demo", "budget_usd": "nan"}, "budget_usd"),
           ({"tenant": "demo", "budget_usd": "ten"}, "is not a number"),
           ({"tenant": "demo", "budget_usd": True}, "budget_usd"),
           ({"tenant": "demo", "budget_usd": 1, "budget_period": "year"}, "not one of day, week, month"),
           ({"tenant": "demo", "budget_period": "day"}, "needs budget_usd"),
           ({"tenant": "demo", "expires": "tomorrow"}, "neither an ISO 8601 time"),
           ({"tenant": "demo", "expires": "2020-01-01T00:00:00Z"}, "in the past"),
           ({"tenant": "demo", "expires": "0d"}, "not in the future"),
           ({"tenant": "demo", "models": "nope"}, "unknown model 'nope'"),
           ({"tenant": "demo", "models": []}, "non-empty list")]
    for fields, message in bad:
        with pytest.raises(KeySpecError, match=message):
            build_spec(demo_config, now=now, **fields)
    limited = build_spec(demo_config, tenant="demo", rpm="60", tpm=90000)
    assert (limited.rpm, limited.tpm) == (60, 90000)
    assert spec_from_json(demo_config, {"tenant": "demo", "rpm": 3}).rpm == 3
    for fields_, message in (({"rpm": "0"}, "rpm: must be from 1 to 4500000 per minute, got 0"),
                             ({"rpm": -2}, "rpm: must be from 1"), ({"tpm": 4_500_001}, "tpm: must be from 1"),
                             ({"rpm": "3.5"}, "rpm: expected a whole number per minute, got '3.5'"),
                             ({"tpm": 1.0}, "tpm: expected a whole number"), ({"rpm": True}, "rpm: expected")):
        with pytest.raises(KeySpecError, match=message):
            build_spec(demo_config, tenant="demo", **fields_)
    with pytest.raises(KeySpecError, match="colour: unknown field"):
        spec_from_json(demo_config, {"tenant": "demo", "colour": "red"})
    assert parse_expiry("30d", now) == now + 30 * 86400
    assert parse_expiry("90s", now) == now + 90
    assert parse_expiry("2030-01-01T00:00:00", now) == 1_893_456_000.0  # no zone: UTC


def test_store_location_follows_the_config_file(demo_config: GatewayConfig, tmp_path: Path) -> None:
    cfg_file = tmp_path / "conf" / "modelyard.yaml"
    assert store_dsn(demo_config, cfg_file) == f"sqlite:///{tmp_path / 'conf' / 'run' / 'keys.db'}"
    rel = demo_config.model_copy(update={"keys": demo_config.keys.model_copy(update={"store": "sqlite:///k/x.db"})})
    assert store_dsn(rel, cfg_file) == f"sqlite:///{tmp_path / 'conf' / 'run' / 'k' / 'x.db'}"
    pg = demo_config.model_copy(update={"keys": demo_config.keys.model_copy(
        update={"store": "postgresql://u@db:5432/keys"})})
    assert store_dsn(pg, cfg_file) == "postgresql://u@db:5432/keys"


def test_config_refuses_a_bad_store_or_plaintext_admin_key(demo_config: GatewayConfig) -> None:
    data = demo_config.model_dump()
    with pytest.raises(ConfigError, match="keys.store: .*expected sqlite:///PATH or postgresql"):
        parse_config({**data, "keys": {"store": "mysql://x"}})
    with pytest.raises(ConfigError, match="admin_keys hold sha256 hex digests"):
        parse_config({**data, "keys": {"admin_keys": ["my-plaintext"]}})


# -- the key ring: config keys first, then the store's ------------------------------------------------


def _ring(config: GatewayConfig) -> tuple[KeyRing, KeyCache, KeyStore]:
    cache = KeyCache()
    return KeyRing(config.tenants, cache), cache, KeyStore(connect("sqlite:///:memory:"))


def test_store_key_narrows_its_tenant(demo_config: GatewayConfig) -> None:
    ring, cache, store = _ring(demo_config)
    rec, secret = store.create(KeySpec(tenant="demo-l3", models=("demo-gpt", "demo-claude"), budget_usd=1.0,
                                       budget_period="day"))
    assert ring.identify(secret) is None  # not read yet
    cache.apply(store.changed_since(0))
    found = ring.identify(secret)
    assert isinstance(found, Identity)
    # demo-l3 may use demo-mini, demo-gpt, auto: the key's list meets it in demo-gpt only.
    assert found.tenant.name == "demo-l3" and found.tenant.allowed_models == ["demo-gpt"]
    assert found.tenant.tier == "L3"
    assert found.caller.key_id == rec.id and found.caller.tenant == "demo-l3"
    assert found.caller.models == frozenset({"demo-gpt", "demo-claude"})
    assert found.caller.budget == Budget(usd=1.0, period="day")
    assert ring.identify(secret) is found  # made once per key version
    wide, wide_secret = store.create(KeySpec(tenant="demo"))
    cache.apply(store.changed_since(cache.version))
    got = ring.identify(wide_secret)
    assert isinstance(got, Identity) and got.tenant is demo_config.tenants[0]  # no narrowing: the tenant itself
    assert got.caller.models is None


def test_config_keys_come_first_and_carry_no_key_id(demo_config: GatewayConfig) -> None:
    ring, _, _ = _ring(demo_config)
    found = ring.identify("sk-modelyard-demo")
    assert isinstance(found, Identity) and found.caller.key_id is None and found.caller.tenant == "demo"
    assert ring.identify("sk-wrong") is None and ring.identify(None) is None and ring.identify("") is None


def test_expired_and_orphaned_store_keys_are_refused(demo_config: GatewayConfig) -> None:
    ring, cache, store = _ring(demo_config)
    rec, secret = store.create(KeySpec(tenant="demo", expires_at=time.time() + 60))
    cache.apply(store.changed_since(0))
    assert isinstance(ring.identify(secret), Identity)
    assert ring.identify(secret, now=rec.expires_at) is EXPIRED  # type: ignore[arg-type]
    # A key whose tenant left the config stops with it.
    others = [t for t in demo_config.tenants if t.name != "demo"]
    assert KeyRing(others, cache).identify(secret) is None


def test_admin_keys_match_digests_only() -> None:
    admin = AdminKeys([digest_of("adm-1"), "sha256:" + digest_of("adm-2")])
    assert admin.enabled
    assert admin.check("adm-1") == digest_of("adm-1") and admin.check("adm-2") == digest_of("adm-2")
    assert admin.check("adm-3") is None and admin.check(None) is None
    assert not AdminKeys([]).enabled and AdminKeys([]).check("adm-1") is None


# -- per-key rate limits: stored, migrated into an older store, carried to the caller -------------------


def test_a_keys_limits_round_trip_and_reach_its_caller(demo_config: GatewayConfig) -> None:
    ring, cache, store = _ring(demo_config)
    rec, secret = store.create(KeySpec(tenant="demo", rpm=3, tpm=1200))
    plain, plain_secret = store.create(KeySpec(tenant="demo"))
    assert (store.get(rec.id).rpm, store.get(rec.id).tpm) == (3, 1200) and (plain.rpm, plain.tpm) == (None, None)
    assert rec.view()["rpm"] == 3 and rec.view()["tpm"] == 1200 and plain.view()["rpm"] is None
    rotated, new_secret = store.rotate(rec.id)
    assert (rotated.rpm, rotated.tpm) == (3, 1200)  # a new secret, the same limits
    cache.apply(store.changed_since(0))
    found, other = ring.identify(new_secret), ring.identify(plain_secret)
    assert isinstance(found, Identity) and (found.caller.rpm, found.caller.tpm) == (3, 1200)
    assert isinstance(other, Identity) and (other.caller.rpm, other.caller.tpm) == (None, None)
    config_key = ring.identify("sk-modelyard-demo")
    assert isinstance(config_key, Identity) and config_key.caller.rpm is None


def test_an_older_sqlite_store_gains_the_limit_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)  # the schema as it was before per-key limits, with one key in it
    old.execute("""CREATE TABLE keys (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, digest TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL, models TEXT, expires_at DOUBLE PRECISION, budget_usd DOUBLE PRECISION,
        budget_period TEXT, created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION,
        updated_at DOUBLE PRECISION NOT NULL, version BIGINT NOT NULL)""")
    old.execute("INSERT INTO keys VALUES ('key_old', 'demo', 'ab', 'old', NULL, NULL, NULL, NULL, 1, NULL, 1, 1)")
    old.commit()
    old.close()
    store, again = _store(f"sqlite:///{path}"), _store(f"sqlite:///{path}")  # a second opener adds nothing twice
    assert (store.get("key_old").rpm, store.get("key_old").tpm) == (None, None)
    rec, _ = store.create(KeySpec(tenant="demo", rpm=10))
    assert again.get(rec.id).rpm == 10
    columns = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(keys)")]
    assert columns[-2:] == ["rpm", "tpm"] and columns.count("rpm") == 1
    store.close()
    again.close()


def test_update_narrows_models_and_sets_the_budget(sqlite_dsn: str, demo_config: GatewayConfig) -> None:
    """`modelyard keys update`, the admin API's update and the console's: narrow only, same secret, a new
    version (every worker's refresh sees it), never on a revoked key."""
    store = _store(sqlite_dsn)
    rec, secret = store.create(build_spec(demo_config, tenant="demo", models="demo-gpt,demo-mini"))
    narrowed = store.update(rec.id, build_change(demo_config, "demo", models="demo-mini", budget_usd=3,
                                                 budget_period="day"))
    assert narrowed.models == ("demo-mini",) and narrowed.budget_usd == 3 and narrowed.budget_period == "day"
    assert narrowed.digest == digest_of(secret) and narrowed.version > rec.version
    with pytest.raises(KeySpecError, match="only narrows"):
        store.update(rec.id, build_change(demo_config, "demo", models="demo-mini,demo-gpt"))
    assert store.get(rec.id).models == ("demo-mini",)  # the refused change left nothing behind
    kept = store.update(rec.id, build_change(demo_config, "demo", budget_usd=7))
    assert kept.models == ("demo-mini",) and (kept.budget_usd, kept.budget_period) == (7, "month")
    anyone, _ = store.create(build_spec(demo_config, tenant="demo"))  # all of the tenant's: any model narrows it
    assert store.update(anyone.id, build_change(demo_config, "demo", models="demo-gpt")).models == ("demo-gpt",)
    with pytest.raises(KeySpecError, match="nothing to change"):
        build_change(demo_config, "demo")
    with pytest.raises(KeySpecError, match="cannot change on a key"):
        change_from_json(demo_config, "demo", {"tenant": "other"})
    store.revoke(rec.id)
    with pytest.raises(RevokedKey):
        store.update(rec.id, build_change(demo_config, "demo", budget_usd=1))
    store.close()
