"""Tool-call ids that carry what a protocol without a place for it must hand back.

Gemini 3 signs its function calls (`thoughtSignature`) and refuses a replayed call without
the signature. OpenAI and Anthropic clients have no field for it, but they do hand every call's
id back verbatim with the next turn; so the signature rides in the id
(`<id>__ts_<base64url signature>`, only characters Anthropic's id pattern allows), is read back
when the history returns, and is stripped again before the id goes to an OpenAI or Anthropic
upstream. Gemini calls carry no ids at all: `new_call_id` makes ones unique across a conversation.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid

__all__ = ["new_call_id", "with_signature", "split_signature", "plain_id"]

_MARK = "__ts_"


def new_call_id(response_id: str, ordinal: int) -> str:
    """An id unique across a conversation for a call that came without one (Gemini): per-turn
    counters repeat, and a replayed history with duplicate ids is refused by Anthropic. Derived
    from the response's own id, so the same bytes always give the same ids."""
    seed = response_id or uuid.uuid4().hex
    return f"call_{hashlib.sha256(seed.encode()).hexdigest()[:16]}_{ordinal}"


def with_signature(call_id: str, signature: str | None) -> str:
    """The id a client without a signature field gets: the signature appended, base64url."""
    if not signature:
        return call_id
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raw = signature.encode()  # not base64 after all: carried as its bytes
    return call_id + _MARK + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def split_signature(call_id: str) -> tuple[str, str | None]:
    """(id without the signature, the signature as Gemini sent it, or None)."""
    base, mark, tail = call_id.partition(_MARK)
    if not mark or not tail:
        return call_id, None
    try:
        raw = base64.urlsafe_b64decode(tail + "=" * (-len(tail) % 4))
    except (binascii.Error, ValueError):
        return call_id, None
    return base, base64.b64encode(raw).decode()


def plain_id(call_id: str) -> str:
    """The id without a carried signature (what an OpenAI or Anthropic upstream gets)."""
    return split_signature(call_id)[0]
