"""A key's secret and id: the secret is shown once and only its sha256 is kept."""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "my-"  # says where a leaked key came from (secret scanners match on it)


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    """A key's public name: safe in logs, URLs and metering rows (it is not the secret)."""
    return "key_" + secrets.token_hex(8)


def digest_of(secret: str) -> str:
    """The sha256 hex the store keeps (the same form as a config file's `api_keys`)."""
    return hashlib.sha256(secret.encode("utf-8", "replace")).hexdigest()
