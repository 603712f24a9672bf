"""Sign-in sessions and spent CSRF tokens, in the key store's database (SQLite or PostgreSQL through
`keys.db`): every extproc worker and replica that shares the key store sees the same sessions, so a
page may be answered by any of them. Blocking: the shell calls it in a worker thread.

The cookie holds a random secret; the table holds its sha256 only (as the keys table holds keys)."""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

from keys.db import Database

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS console_sessions (
        digest TEXT PRIMARY KEY,
        admin TEXT NOT NULL,
        csrf_secret TEXT NOT NULL,
        created_at REAL NOT NULL,
        expires_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS console_spent_tokens (
        nonce TEXT PRIMARY KEY,
        expires_at REAL NOT NULL
    )""",
)
_SCHEMA_LOCK = 7_306_322  # beside keys.store's 7_306_321


@dataclass(frozen=True, slots=True)
class ConsoleSession:
    admin: str  # the admin key's sha256 digest (audit rows name its first 12 digits)
    csrf_secret: str
    expires_at: float


def _digest(cookie: str) -> str:
    return hashlib.sha256(cookie.encode()).hexdigest()


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        with db.transaction():
            if db.dialect == "postgresql":  # replicas starting together create the tables once
                db.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for stmt in SCHEMA:
                db.execute(stmt)

    def open(self, admin: str, ttl_s: float, now: float | None = None) -> tuple[str, ConsoleSession]:
        """A new session for a checked admin key: (the cookie's value, the session)."""
        now = time.time() if now is None else now
        cookie = secrets.token_urlsafe(32)
        sess = ConsoleSession(admin=admin, csrf_secret=secrets.token_urlsafe(32), expires_at=now + ttl_s)
        with self.db.transaction():
            self.db.execute("DELETE FROM console_sessions WHERE expires_at < ?", (now,))
            self.db.execute("DELETE FROM console_spent_tokens WHERE expires_at < ?", (now,))
            self.db.execute("INSERT INTO console_sessions (digest, admin, csrf_secret, created_at, expires_at) "
                            "VALUES (?, ?, ?, ?, ?)", (_digest(cookie), admin, sess.csrf_secret, now, sess.expires_at))
        return cookie, sess

    def find(self, cookie: str, now: float | None = None) -> ConsoleSession | None:
        now = time.time() if now is None else now
        row = self.db.fetchone("SELECT admin, csrf_secret, expires_at FROM console_sessions WHERE digest = ?",
                               (_digest(cookie),))
        if row is None or float(row[2]) <= now:
            return None
        return ConsoleSession(admin=str(row[0]), csrf_secret=str(row[1]), expires_at=float(row[2]))

    def close(self, cookie: str) -> None:
        self.db.execute("DELETE FROM console_sessions WHERE digest = ?", (_digest(cookie),))

    def spend(self, nonce: str, expires_at: float) -> bool:
        """Mark a CSRF token used: True the first time, False for a replay."""
        return self.db.execute("INSERT INTO console_spent_tokens (nonce, expires_at) VALUES (?, ?) "
                               "ON CONFLICT (nonce) DO NOTHING", (nonce, expires_at)) == 1
