"""CSRF tokens, pure: `<issued>.<nonce>.<mac>`, the MAC keyed by the session's own secret. A forged
token fails the MAC; a replayed one is refused by the store, which spends each nonce once
(`console.sessions.SessionStore.spend`)."""

from __future__ import annotations

import hashlib
import hmac
import secrets

MAX_AGE_S = 3600.0  # a form left open longer asks for a reload, not a stale token


def mint(secret: str, now: float) -> str:
    body = f"{int(now)}.{secrets.token_urlsafe(16)}"
    return f"{body}.{_mac(secret, body)}"


def check(secret: str, token: str, now: float, max_age_s: float = MAX_AGE_S) -> str | None:
    """Why the token is refused, or None when it is this session's and fresh (not yet spent: the
    store says that)."""
    parts = token.split(".")
    if len(parts) != 3 or not parts[0].isdigit():
        return "malformed CSRF token"
    body = f"{parts[0]}.{parts[1]}"
    if not hmac.compare_digest(_mac(secret, body), parts[2]):
        return "CSRF token not issued to this session"
    age = now - int(parts[0])
    if age < -60 or age > max_age_s:
        return "CSRF token expired: reload the page"
    return None


def nonce_of(token: str) -> str:
    """What the store remembers of a spent token: its digest (the token itself never rests anywhere)."""
    return hashlib.sha256(token.encode()).hexdigest()


def _mac(secret: str, body: str) -> str:
    return hmac.new(secret.encode(), body.encode(), hashlib.sha256).hexdigest()[:32]
