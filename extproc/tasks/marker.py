"""The replay marker: proof that a request comes from this gateway's task worker, not a client.

The value is `v1:<task id>:<tenant>:<hex HMAC-SHA256>` under a key only the extproc holds; the
session strips any copy a client sends and, for a valid one, runs the request as that tenant's
task (no API key is stored with a task, so the marker is what authenticates the replay).
"""

from __future__ import annotations

import hashlib
import hmac
import os

MARKER_HEADER = "x-modelyard-task-replay"
_VERSION = "v1"


class ReplayMarker:
    def __init__(self, key: bytes | None = None) -> None:
        # Per process unless configured: fine for one replica, which makes and checks its own markers.
        self._key = key or os.urandom(32)

    def _sig(self, task_id: str, tenant: str) -> str:
        return hmac.new(self._key, f"{_VERSION}\n{task_id}\n{tenant}".encode(), hashlib.sha256).hexdigest()

    def sign(self, task_id: str, tenant: str) -> str:
        return f"{_VERSION}:{task_id}:{tenant}:{self._sig(task_id, tenant)}"

    def verify(self, value: str | None) -> tuple[str, str] | None:
        """(task id, tenant) for a marker this key made; None for anything else."""
        if not value:
            return None
        head, _, sig = value.rpartition(":")
        version, _, rest = head.partition(":")
        task_id, _, tenant = rest.partition(":")
        if version != _VERSION or not task_id or not tenant:
            return None
        if not hmac.compare_digest(sig.encode(), self._sig(task_id, tenant).encode()):
            return None
        return task_id, tenant
