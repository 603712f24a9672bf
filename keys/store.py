"""The key store: keys as rows, over `keys.db` (SQLite or PostgreSQL, one schema).

Each write bumps a store-wide `version` under a write lock, so versions appear in commit order and
a reader that asks for rows above the last version it saw misses none (`changed_since`).
"""

from __future__ import annotations

import builtins
import json
import time
from typing import Any

from keys.db import Database
from keys.record import KeyRecord
from keys.secret import digest_of, new_id, new_secret
from keys.spec import KeyChange, KeySpec, narrowing

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS keys (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        digest TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        models TEXT,
        expires_at DOUBLE PRECISION,
        budget_usd DOUBLE PRECISION,
        budget_period TEXT,
        created_at DOUBLE PRECISION NOT NULL,
        revoked_at DOUBLE PRECISION,
        updated_at DOUBLE PRECISION NOT NULL,
        version BIGINT NOT NULL,
        rpm BIGINT,
        tpm BIGINT)""",
    "CREATE INDEX IF NOT EXISTS keys_version ON keys (version)",
    "CREATE INDEX IF NOT EXISTS keys_tenant ON keys (tenant)",
)
# Columns added since the first schema, last in the table: (name, type). A store made before them
# gets them at open (old rows read NULL: no such limit).
ADDED_COLUMNS = (("rpm", "BIGINT"), ("tpm", "BIGINT"))
_COLUMNS = ("id, tenant, digest, name, models, expires_at, budget_usd, budget_period, created_at, revoked_at, "
            "updated_at, version, rpm, tpm")
_SCHEMA_LOCK = 7_306_321  # PostgreSQL advisory lock: replicas starting together create the table once


class UnknownKey(LookupError):
    """No key has this id."""


class RevokedKey(ValueError):
    """The key is revoked: it cannot be rotated (create a new one)."""


def _record(row: tuple[Any, ...]) -> KeyRecord:
    models = json.loads(row[4]) if row[4] is not None else None
    return KeyRecord(id=row[0], tenant=row[1], digest=row[2], name=row[3],
                     models=tuple(models) if models is not None else None, expires_at=row[5], budget_usd=row[6],
                     budget_period=row[7], created_at=row[8], revoked_at=row[9], updated_at=row[10],
                     version=int(row[11]), rpm=row[12], tpm=row[13])


class KeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        with db.transaction():
            if db.dialect == "postgresql":
                db.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
            for stmt in SCHEMA:
                db.execute(stmt)
            self._add_columns()

    def create(self, spec: KeySpec, now: float | None = None) -> tuple[KeyRecord, str]:
        """A new key and its secret (the only time the secret exists outside the caller's hands)."""
        now = time.time() if now is None else now
        secret = new_secret()
        key_id = new_id()
        models = json.dumps(list(spec.models)) if spec.models is not None else None
        with self.db.transaction(lock="keys"):
            version = self._next_version()
            self.db.execute(
                f"INSERT INTO keys ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (key_id, spec.tenant, digest_of(secret), spec.name, models, spec.expires_at, spec.budget_usd,
                 spec.budget_period, now, None, now, version, spec.rpm, spec.tpm))
        return self.get(key_id), secret

    def get(self, key_id: str) -> KeyRecord:
        row = self.db.fetchone(f"SELECT {_COLUMNS} FROM keys WHERE id = ?", (key_id,))
        if row is None:
            raise UnknownKey(f"no key with id {key_id!r}")
        return _record(row)

    def by_digest(self, digest: str) -> KeyRecord | None:
        """The key with this secret's sha256, revoked or not (the request path's miss lookup: one
        indexed read; the row's version lets the cache order it against the refresher's)."""
        row = self.db.fetchone(f"SELECT {_COLUMNS} FROM keys WHERE digest = ?", (digest,))
        return None if row is None else _record(row)

    def list(self, tenant: str | None = None) -> builtins.list[KeyRecord]:
        if tenant is None:
            rows = self.db.fetchall(f"SELECT {_COLUMNS} FROM keys ORDER BY created_at, id")
        else:
            rows = self.db.fetchall(f"SELECT {_COLUMNS} FROM keys WHERE tenant = ? ORDER BY created_at, id", (tenant,))
        return [_record(r) for r in rows]

    def rotate(self, key_id: str, now: float | None = None) -> tuple[KeyRecord, str]:
        """A new secret for the same key (id, tenant, budget and spend stay); the old one stops."""
        now = time.time() if now is None else now
        secret = new_secret()
        with self.db.transaction(lock="keys"):
            if self.get(key_id).revoked_at is not None:
                raise RevokedKey(f"key {key_id} is revoked: it cannot be rotated (create a new one)")
            self.db.execute("UPDATE keys SET digest = ?, updated_at = ?, version = ? WHERE id = ?",
                            (digest_of(secret), now, self._next_version(), key_id))
        return self.get(key_id), secret

    def update(self, key_id: str, change: KeyChange, now: float | None = None) -> KeyRecord:
        """Narrow a live key's models and/or set its budget (the secret and id stay); every worker sees it at
        its next refresh, as a rotation."""
        now = time.time() if now is None else now
        with self.db.transaction(lock="keys"):
            rec = self.get(key_id)
            if rec.revoked_at is not None:
                raise RevokedKey(f"key {key_id} is revoked: it cannot be changed (create a new one)")
            sets: list[str] = []
            args: list[Any] = []
            if change.models is not None:
                narrowing(rec.models, change.models)
                sets.append("models = ?")
                args.append(json.dumps(list(change.models)))
            if change.budget_usd is not None:
                sets += ["budget_usd = ?", "budget_period = ?"]
                args += [change.budget_usd, change.budget_period or "month"]
            self.db.execute(f"UPDATE keys SET {', '.join(sets)}, updated_at = ?, version = ? WHERE id = ?",
                            (*args, now, self._next_version(), key_id))
        return self.get(key_id)

    def revoke(self, key_id: str, now: float | None = None) -> KeyRecord:
        """The key stops working everywhere within a refresh; revoking twice is a no-op."""
        now = time.time() if now is None else now
        with self.db.transaction(lock="keys"):
            rec = self.get(key_id)
            if rec.revoked_at is None:
                self.db.execute("UPDATE keys SET revoked_at = ?, updated_at = ?, version = ? WHERE id = ?",
                                (now, now, self._next_version(), key_id))
        return self.get(key_id)

    def changed_since(self, version: int) -> builtins.list[KeyRecord]:
        """Rows written after `version`, oldest change first."""
        rows = self.db.fetchall(f"SELECT {_COLUMNS} FROM keys WHERE version > ? ORDER BY version", (version,))
        return [_record(r) for r in rows]

    def close(self) -> None:
        self.db.close()

    # -- private -------------------------------------------------------------------------------

    def _add_columns(self) -> None:
        """Inside the schema transaction (SQLite's write lock or PostgreSQL's advisory lock): two
        processes opening an older store together add each column once."""
        if self.db.dialect == "postgresql":
            # Looked up first: ALTER TABLE locks the table out of every replica's refresh, even as a no-op.
            have = {row[0] for row in self.db.fetchall(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = 'keys'")}
        else:
            have = {row[1] for row in self.db.fetchall("PRAGMA table_info(keys)")}
        for name, kind in ADDED_COLUMNS:
            if name not in have:
                self.db.execute(f"ALTER TABLE keys ADD COLUMN {name} {kind}")

    def _next_version(self) -> int:
        row = self.db.fetchone("SELECT COALESCE(MAX(version), 0) FROM keys")
        return int(row[0] if row else 0) + 1

