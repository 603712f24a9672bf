"""A task stores the identity answer: the replay asks Envoy for it, and decodes any coding that still
comes back, so a poll reads the body a synchronous call reads whatever the submitter's client accepted.

The submitter's Accept-Encoding is about the 202, not the result: each poll negotiates its own
encoding with Envoy's compressor. Asking for identity is the fix (the worker then needs no decoder
for br or zstd, which Envoy may be configured to send); decoding gzip and deflate is the guard for an
answer that arrives coded anyway. Pure: no I/O.
"""

from __future__ import annotations

import zlib

ACCEPT_ENCODING = "accept-encoding"
# The replay's own preference: aiohttp would otherwise send its default `gzip, deflate`.
IDENTITY = (ACCEPT_ENCODING, "identity")
_MAX_RESULT_BYTES = 256 << 20  # a coded answer inflating past this is refused, not stored (a zip bomb)


class UndecodableAnswer(ValueError):
    """The answer came back in a coding the worker cannot undo, or its bytes are broken."""


def replay_headers(stored: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """The stored request's headers for the replay: identity asked, whatever the task stored
    (tasks stored before accept-encoding was dropped still carry the submitter's)."""
    return [*((k, v) for k, v in stored if k.lower() != ACCEPT_ENCODING), IDENTITY]


def _inflate(body: bytes, wbits: int) -> bytes:
    d = zlib.decompressobj(wbits)
    out = d.decompress(body, _MAX_RESULT_BYTES)
    if d.unconsumed_tail:
        raise UndecodableAnswer(f"the answer inflates past {_MAX_RESULT_BYTES} bytes")
    if not d.eof:
        raise UndecodableAnswer("the coded answer is truncated")
    if d.unused_data and wbits > zlib.MAX_WBITS:  # gzip members may follow one another (RFC 1952)
        return out + _inflate(d.unused_data, wbits)
    return out


def _decode_one(body: bytes, coding: str) -> bytes:
    try:
        if coding in ("gzip", "x-gzip"):
            return _inflate(body, 16 + zlib.MAX_WBITS)
        if coding == "deflate":  # RFC 9110: zlib-wrapped; some servers send raw deflate
            return _inflate(body, zlib.MAX_WBITS if body[:1] == b"\x78" else -zlib.MAX_WBITS)
    except zlib.error as e:
        raise UndecodableAnswer(f"the answer's {coding} body is broken ({e})") from None
    raise UndecodableAnswer(f"the answer came back in Content-Encoding {coding[:32]!r}, which the task "
                            "worker cannot decode")


def identity_body(body: bytes, content_encoding: str | None) -> bytes:
    """`body` with its content codings undone, last applied first (RFC 9110 8.4)."""
    codings = [c.strip().lower() for c in (content_encoding or "").split(",")]
    for coding in reversed([c for c in codings if c and c != "identity"]):
        body = _decode_one(body, coding)
    return body
