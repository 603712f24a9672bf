"""Console sessions and spent CSRF tokens in the key store's SQLite: a session any worker can read,
expiry, sign-out, and each token spent once."""

from __future__ import annotations

from pathlib import Path

from console.sessions import SessionStore
from keys.db import connect


def test_sessions_are_shared_expire_and_close(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'keys.db'}"
    a, b = SessionStore(connect(dsn)), SessionStore(connect(dsn))  # two workers
    cookie, sess = a.open("d" * 64, ttl_s=60, now=1000.0)
    assert b.find(cookie, now=1010.0) == sess
    assert b.find(cookie, now=1061.0) is None  # expired
    assert b.find("another", now=1010.0) is None
    assert "d" * 64 not in cookie and cookie not in str(a.db.fetchall("SELECT * FROM console_sessions"))
    b.close(cookie)
    assert a.find(cookie, now=1010.0) is None


def test_a_csrf_token_is_spent_once_whichever_worker_sees_it(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'keys.db'}"
    a, b = SessionStore(connect(dsn)), SessionStore(connect(dsn))
    assert a.spend("n1", 2000.0) is True
    assert b.spend("n1", 2000.0) is False
    assert b.spend("n2", 2000.0) is True



def test_sessions_and_tokens_on_postgresql() -> None:
    """Replicas share PostgreSQL: two stores (two replicas) see one session, and a token spent once."""
    from tests.keys.postgres_server import running_database

    with running_database("console") as (_, dsn):
        a, b = SessionStore(connect(dsn)), SessionStore(connect(dsn))
        cookie, sess = a.open("e" * 64, ttl_s=60, now=1000.0)
        assert b.find(cookie, now=1001.0) == sess
        assert a.spend("n", 2000.0) is True and b.spend("n", 2000.0) is False
        a.db.close()
        b.db.close()
