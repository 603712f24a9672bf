"""What a caller may learn from an upstream's error body, and what the log keeps of it.

A model server in debug mode answers a 5xx with a Python traceback: file paths, library
versions, sometimes request data. The caller gets the status and, only when the body is a
well-formed provider error object, its message's first line, capped, with paths masked; the
log keeps the (truncated) whole for whoever runs the gateway.
"""

from __future__ import annotations

import re

import orjson

MAX_MESSAGE_CHARS = 200
MAX_LOG_CHARS = 2000
# Traceback lines and frames: a message that looks like one is dropped, not trimmed.
_TRACE = re.compile(r'Traceback \(most recent call last\)|^\s*File "|\bat [\w.$]+\([\w.]+:\d+\)', re.M)
# Absolute file paths (two segments or more; URLs keep theirs: a path there follows a word or ':').
_PATH = re.compile(r"(?<![\w:/.])/(?:[\w.@+-]+/)+[\w.@+-]*|(?<!\w)[A-Za-z]:\\[^\s'\"]+")


def sanitize(text: str) -> str | None:
    """The first line of a provider message, paths masked and capped; None when it is a trace."""
    if not text or _TRACE.search(text):
        return None
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = _PATH.sub("<path>", line)
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[:MAX_MESSAGE_CHARS - 1].rstrip() + "\u2026"
    return line or None


def provider_message(body: bytes) -> str | None:
    """error.message, error (a string) or message of a JSON error object, sanitized; else None."""
    try:
        obj = orjson.loads(body)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if type(obj) is list and obj and type(obj[0]) is dict:
        obj = obj[0]  # Gemini's non-SSE stream answers errors as a one-element array
    if type(obj) is not dict:
        return None
    err = obj.get("error")
    if type(err) is dict and type(err.get("message")) is str:
        return sanitize(err["message"])
    if type(err) is str:
        return sanitize(err)
    msg = obj.get("message")
    return sanitize(msg) if type(msg) is str else None


def client_text(status: int, body: bytes, task_id: str = "") -> str:
    """The message a caller sees: `upstream error (HTTP 500)`, plus the provider's own when usable,
    and the task id the gateway logged the whole reply under, for whoever the caller asks."""
    detail = provider_message(body)
    return (f"upstream error (HTTP {status})" + (f": {detail}" if detail else "")
            + (f" (task {task_id})" if task_id else ""))


def log_excerpt(body: bytes) -> str:
    """The body for the log: decoded, truncated, on one line (repr escapes the newlines)."""
    text = bytes(body[:MAX_LOG_CHARS]).decode("utf-8", "replace")
    return repr(text) + (" (truncated)" if len(body) > MAX_LOG_CHARS else "")
