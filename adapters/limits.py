"""Structural limits every protocol parser enforces before it builds objects (docs/security.md).

Counted on the parsed JSON's lists (a `len`, no walk), so a body of a hundred thousand messages is
refused in microseconds instead of validated for seconds. The JSON value count and depth
(`adapters/json_shape.py`) are checked before parsing at all.
"""

from __future__ import annotations

from collections.abc import Sized

from contracts.errors import ClientError

MAX_MESSAGES = 4096  # chat turns per request (messages / contents)
MAX_CONTENT_PARTS = 512  # content parts or blocks per turn
MAX_TOOLS = 512  # tool / function declarations per request
# Every value of a chat request (a turn is ~5): leaves room for long chats and big tool schemas,
# and bounds what the JSON parser allocates while it holds the GIL.
MAX_CHAT_JSON_VALUES = 200_000
# KServe tensors arrive as JSON arrays: values are bounded by the body size alone, containers here.
MAX_KSERVE_CONTAINERS = 200_000
MAX_KSERVE_TENSORS = 64  # inputs, outputs, parameters per request or tensor


def check_count(items: Sized, limit: int, what: str) -> None:
    """413 when `items` holds more than `limit` entries; `what` names them ("messages")."""
    if len(items) > limit:
        raise ClientError(f"{what}: {len(items)} exceed the limit of {limit}", status=413)
