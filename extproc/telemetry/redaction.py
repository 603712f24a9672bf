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
# name=value in a query string or form body.
_FORM_FIELD = re.compile(r"(\b" + _CREDENTIAL_NAME + r"=)[^&\s\"']+", re.IGNORECASE)
_KEY_SHAPED = re.compile(
    r"(?:\bBearer\s+[A-Za-z0-9._~+/=-]{8,}"
    r"|\bsk-[A-Za-z0-9_-]{12,}"
    r"|\bAIza[0-9A-Za-z_-]{30,}"
    r"|\bAKIA[0-9A-Z]{16}\b)")
# user:password@ in a URL (a Redis or database URL quoted in a body or an error).
_URL_USERINFO = re.compile(r"(?<=://)[^/\s:@]*:[^/\s@]+@")


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
        text = _FORM_FIELD.sub(lambda m: f"{m[1]}{REDACTED}", text)
        text = _KEY_SHAPED.sub(REDACTED, text)
        text = _URL_USERINFO.sub(f"{REDACTED}@", text)
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
