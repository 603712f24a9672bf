"""The recorded provider traffic in `data/` (SOURCES.md says where each file came from), loaded
as bytes, and the framing that turns a chunks file (one JSON payload a line) into its SSE stream."""

from __future__ import annotations

from pathlib import Path

import orjson

DATA = Path(__file__).resolve().parent / "data"
RECORDED: dict[str, bytes] = {p.name: p.read_bytes() for p in sorted(DATA.iterdir()) if p.is_file()}


def sse_from_chunks(protocol: str, text: bytes) -> bytes:
    """A chunks file as the provider sent it on the wire: Anthropic names each event after its
    type, OpenAI ends with [DONE], Gemini (alt=sse) separates events with CRLF pairs."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if protocol == "anthropic":
        return b"".join(b"event: " + orjson.loads(ln)["type"].encode() + b"\ndata: " + ln + b"\n\n" for ln in lines)
    if protocol == "openai":
        return b"".join(b"data: " + ln + b"\n\n" for ln in lines) + b"data: [DONE]\n\n"
    return b"".join(b"data: " + ln + b"\r\n\r\n" for ln in lines)
