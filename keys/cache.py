"""The request path's copy of the store: every live key by digest, swapped whole on each change.

Pure: `apply` takes rows (from a refresh or an admin write) and never does I/O. Readers on the
event loop get one consistent pair of dicts, as a refresh builds new ones and swaps the reference.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Iterable

from keys.record import KeyRecord


class KeyCache:
    def __init__(self) -> None:
        self._by_digest: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._gone: dict[str, int] = {}  # revoked key id -> the version that revoked it: no stale copy revives it
        self.version = 0  # the highest store version a refresh has read
        self.loaded = False  # a first full read has completed
        self._writing = threading.Lock()  # a refresh (its thread) and an admin write (the loop) may both apply

    def __len__(self) -> int:
        return len(self._by_id)

    def apply(self, records: Iterable[KeyRecord], *, advance: bool = True) -> int:
        """Take changed rows (oldest first); revoked ones leave. `advance`: the rows are a refresh's,
        so its version moves on; an admin write applied early must not skip rows others wrote before it."""
        records = list(records)
        if not records:
            return 0
        with self._writing:
            return self._apply(records, advance)

    def _apply(self, records: list[KeyRecord], advance: bool) -> int:
        by_digest, by_id = dict(self._by_digest), dict(self._by_id)
        version = self.version
        for rec in records:
            version = max(version, rec.version)
            seen = by_id.get(rec.id)
            newest = seen.version if seen is not None else self._gone.get(rec.id, 0)
            if newest > rec.version:
                continue  # an older copy (a refresh racing an admin write): keep the newer
            if seen is not None:
                del by_id[rec.id]
                by_digest.pop(seen.digest, None)
            if rec.revoked_at is None:
                by_id[rec.id] = rec
                by_digest[rec.digest] = rec
            else:
                self._gone[rec.id] = rec.version
        self._by_digest, self._by_id = by_digest, by_id
        if advance:
            self.version = version
        return len(records)

    def lookup(self, digest: str) -> KeyRecord | None:
        """The live key with this sha256 (expired ones too: the caller tells them apart)."""
        rec = self._by_digest.get(digest)
        # The dict is keyed by a digest, not the secret; the final check is constant-time anyway.
        if rec is None or not hmac.compare_digest(rec.digest, digest):
            return None
        return rec

    def by_id(self, key_id: str) -> KeyRecord | None:
        return self._by_id.get(key_id)
