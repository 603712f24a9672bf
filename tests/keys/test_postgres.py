"""The key store on a real PostgreSQL (started here, as the Redis tests start redis-server): the
same schema and operations as on SQLite, writers on several connections, and a refresher that
survives the server restarting."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from keys.cache import KeyCache
from keys.db import StoreError, connect
from keys.refresher import KeyRefresher
from keys.secret import digest_of
from keys.spec import KeySpec
from keys.store import KeyStore, RevokedKey, UnknownKey
from tests.keys.postgres_server import PostgresServer, available

pytestmark = pytest.mark.skipif(not available(), reason="PostgreSQL is not installed (apt-get install postgresql)")


@pytest.fixture(scope="module")
def pg() -> Iterator[PostgresServer]:
    server = PostgresServer()
    server.start()
    yield server
    server.remove()


@pytest.fixture
def dsn(pg: PostgresServer, request: pytest.FixtureRequest) -> str:
    return pg.create_database(request.node.name.lower().replace("[", "_").replace("]", "")[:60])


def test_operations_match_sqlite_and_keep_only_the_digest(dsn: str) -> None:
    store = KeyStore(connect(dsn))
    KeyStore(connect(dsn)).close()  # the schema twice: a second replica starting
    rec, secret = store.create(KeySpec(tenant="demo", models=("demo-gpt",), budget_usd=4.0, budget_period="month",
                                       expires_at=time.time() + 3600))
    assert store.get(rec.id) == rec and rec.models == ("demo-gpt",) and rec.budget_usd == 4.0
    with psycopg.connect(dsn) as conn:
        dump = repr(conn.execute("SELECT * FROM keys").fetchall())
    assert secret not in dump and digest_of(secret) in dump
    rotated, new = store.rotate(rec.id)
    assert rotated.digest == digest_of(new) and rotated.version == rec.version + 1
    assert store.revoke(rec.id).status() == "revoked"
    with pytest.raises(RevokedKey):
        store.rotate(rec.id)
    with pytest.raises(UnknownKey):
        store.revoke("key_missing")
    assert [r.version for r in store.changed_since(0)] == [3]
    store.close()


def test_db_layer_runs_the_same_sql_on_postgresql(dsn: str) -> None:
    db = connect(dsn)
    db.execute("CREATE TABLE IF NOT EXISTS ledger (key_id TEXT NOT NULL, usd DOUBLE PRECISION NOT NULL)")
    with db.transaction():
        db.executemany("INSERT INTO ledger (key_id, usd) VALUES (?, ?)", [("a", 0.5), ("a", 0.25), ("b", 1.0)])
    with pytest.raises(RuntimeError), db.transaction():
        db.execute("INSERT INTO ledger (key_id, usd) VALUES (?, ?)", ("a", 100.0))
        raise RuntimeError("rolled back")
    assert db.fetchall("SELECT key_id, SUM(usd) FROM ledger GROUP BY key_id ORDER BY key_id") == [
        ("a", 0.75), ("b", 1.0)]
    with pytest.raises(StoreError):
        db.execute("SELECT * FROM no_such_table")
    assert db.fetchone("SELECT 1") == (1,)  # the connection is still usable after an error
    db.close()


def test_writers_on_several_connections_get_versions_in_commit_order(dsn: str) -> None:
    """Replicas' admin APIs and the CLI write at once: versions never repeat, and a reader that has
    seen version v never later finds a row committed with a version below v."""
    stores = [KeyStore(connect(dsn)) for _ in range(3)]
    reader = KeyStore(connect(dsn))
    seen: list[int] = []
    stop = threading.Event()

    def read() -> None:
        last = 0
        while not stop.is_set():
            for r in reader.changed_since(last):
                seen.append(r.version)
                last = r.version

    def write(store: KeyStore) -> None:
        for _ in range(20):
            store.create(KeySpec(tenant="demo"))

    watcher = threading.Thread(target=read)
    watcher.start()
    writers = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    time.sleep(0.2)
    stop.set()
    watcher.join()
    seen += [r.version for r in reader.changed_since(seen[-1] if seen else 0)]
    assert sorted(seen) == seen and seen == list(range(1, 61))  # none skipped, none twice


def test_refresher_survives_a_server_restart(pg: PostgresServer, dsn: str) -> None:
    cache = KeyCache()
    refresher = KeyRefresher(lambda: KeyStore(connect(dsn)), cache, 0.1)
    writer = KeyStore(connect(dsn))
    _, before = writer.create(KeySpec(tenant="demo"))
    refresher.start()
    try:
        assert refresher.wait_loaded(10)
        assert cache.lookup(digest_of(before)) is not None
        pg.stop()
        with pytest.raises(StoreError):
            writer.create(KeySpec(tenant="demo"))
        time.sleep(0.3)  # refreshes fail meanwhile; the last keys still serve
        assert cache.lookup(digest_of(before)) is not None
        pg.start()
        _, after = writer.create(KeySpec(tenant="demo"))  # the writer reconnects by itself
        deadline = time.monotonic() + 5
        while cache.lookup(digest_of(after)) is None:
            assert time.monotonic() < deadline, "the refresher did not reconnect"
            time.sleep(0.05)
    finally:
        refresher.stop()
        writer.close()


def test_an_older_store_gains_the_limit_columns_once(dsn: str) -> None:
    """A store made before per-key limits: the replicas that open it add `rpm` and `tpm` (once, under
    the schema lock); its keys read no limits; new keys keep theirs."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""CREATE TABLE keys (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, digest TEXT NOT NULL UNIQUE,
            name TEXT NOT NULL, models TEXT, expires_at DOUBLE PRECISION, budget_usd DOUBLE PRECISION,
            budget_period TEXT, created_at DOUBLE PRECISION NOT NULL, revoked_at DOUBLE PRECISION,
            updated_at DOUBLE PRECISION NOT NULL, version BIGINT NOT NULL)""")
        conn.execute("INSERT INTO keys VALUES ('key_old', 'demo', 'ab', 'old', NULL, NULL, NULL, NULL, 1, NULL, 1, 1)")
    stores: list[KeyStore] = []
    threads = [threading.Thread(target=lambda: stores.append(KeyStore(connect(dsn)))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(stores) == 3
    old = stores[0].get("key_old")
    assert (old.rpm, old.tpm) == (None, None)
    rec, _ = stores[1].create(KeySpec(tenant="demo", rpm=7, tpm=5000))
    assert (stores[2].get(rec.id).rpm, stores[2].get(rec.id).tpm) == (7, 5000)
    with psycopg.connect(dsn) as conn:
        cols = [r[0] for r in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = 'keys' ORDER BY ordinal_position")]
    assert cols[-2:] == ["rpm", "tpm"]
    for s in stores:
        s.close()
