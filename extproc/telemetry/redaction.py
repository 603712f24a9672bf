"""What of a captured body may go into the audit log: pure text in, redacted and capped text out.

Credential fields (JSON `"api_key": "..."`, form `password=...`), key-shaped strings (bearer
tokens, `sk-...`, Google `AIza...`, AWS access key ids) and URL passwords are always redacted; a tenant adds its
own regexes. Redaction runs before the cap, on a prefix a little longer than the cap, so a
credential that straddles the cap is still caught whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

REDACTED = "[REDACTED]"
# Bytes read past the cap before redacting: longer than any credential we look for.
CAP_MARGIN = 1024

_CREDENTIAL_NAME = (r"(?:[A-Za-z0-9_.-]*(?:api[_-]?key|apikey|secret|password|passwd|credential|private[_-]?key"
                    r"|access[_-]?token|refresh[_-]?token|id[_-]?token|session[_-]?token|auth[_-]?token"
                    r"|bearer[_-]?token)[A-Za-z0-9_.-]*|authorization|token|key)")
# "name": "value" in JSON, escapes included; a value cut off by the end of the text counts too.
_JSON_FIELD = re.compile(r'("' + _CREDENTIAL_NAME + r'"\s*:\s*)"(?:[^"\\]|\\.)*(?:"|\Z)', re.IGNORECASE)
_CREDENTIAL_NAME_ONLY = re.compile(_CREDENTIAL_NAME, re.IGNORECASE)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
# Every credential name above contains one of these.
_NAME_WORDS = ("key", "secret", "passw", "credential", "token", "authorization")
_VALUE_ENDS = frozenset("&\"' \t\r\n")
# Each key shape starts with a literal, so the regex engine jumps between its occurrences; the
# word boundary before it is checked in `_key_shaped` (a leading \b would make it try everywhere).
_KEY_SHAPES = {
    "Bearer": re.compile(r"Bearer\s+[A-Za-z0-9._~+/=-]{8,}"),
    "sk-": re.compile(r"sk-[A-Za-z0-9_-]{12,}"),
    "AIza": re.compile(r"AIza[0-9A-Za-z_-]{30,}"),
    "AKIA": re.compile(r"AKIA[0-9A-Z]{16}(?![0-9A-Z])"),
}
# user:password@ in a URL (a Redis or database URL quoted in a body or an error).
_URL_USERINFO = re.compile(r"://[^/\s:@]*:[^/\s@]+@")


def _form_fields(text: str) -> str:
    """name=value (a query string, a form body) with a credential's name: the value redacted.
    A scan from each '=' rather than a regex: a regex would try a name at every position."""
    out: list[str] = []
    start, i = 0, text.find("=")
    while i != -1:
        j = i
        while j > 0 and text[j - 1] in _NAME_CHARS:
            j -= 1
        k = i + 1
        if j < i and _maybe_credential(text[j:i]) and _CREDENTIAL_NAME_ONLY.fullmatch(text, j, i):
            while k < len(text) and text[k] not in _VALUE_ENDS:
                k += 1
            if k > i + 1:
                out += (text[start:i + 1], REDACTED)
                start = k
        i = text.find("=", k)
    return "".join(out) + text[start:] if out else text


def _maybe_credential(name: str) -> bool:
    """A substring test first: the name regex backtracks, and most names are nothing like it."""
    low = name.lower()
    return any(w in low for w in _NAME_WORDS)


def _key_shaped(text: str) -> str:
    for prefix, rx in _KEY_SHAPES.items():
        if prefix in text:
            text = rx.sub(lambda m: REDACTED if m.start() == 0 or not _word(m.string[m.start() - 1]) else m[0], text)
    return text


def _word(c: str) -> bool:
    return c.isalnum() or c == "_"


class Redactor:
    """The always-on rules plus a tenant's `redact` regexes, compiled once."""

    def __init__(self, patterns: Iterable[str] = ()):
        self.patterns = [re.compile(p) for p in patterns]

    def redact(self, text: str, secrets: Sequence[str] = ()) -> str:
        """`secrets`: exact strings known to be credentials (the caller's own key)."""
        for s in secrets:
            if s:
                text = text.replace(s, REDACTED)
        text = _JSON_FIELD.sub(lambda m: f'{m[1]}"{REDACTED}"', text)
        if "=" in text:
            text = _form_fields(text)
        text = _key_shaped(text)
        if "://" in text:
            text = _URL_USERINFO.sub(f"://{REDACTED}@", text)
        for p in self.patterns:
            text = p.sub(REDACTED, text)
        return text

    def capture(self, body: bytes, cap: int, *, total: int | None = None, secrets: Sequence[str] = ()) -> str:
        """A body as it may be stored: decoded, redacted, then cut to `cap` bytes with a note of
        how much was left out. `total`: the body's full size when `body` is already a prefix."""
        total = len(body) if total is None else total
        text = self.redact(body[:cap + CAP_MARGIN].decode("utf-8", "replace"), secrets)
        raw = text.encode("utf-8")
        if len(raw) <= cap and total == len(body) <= cap + CAP_MARGIN:
            return text
        kept = raw[:cap].decode("utf-8", "ignore")
        return f"{kept}...[truncated: {total} bytes in all]"
