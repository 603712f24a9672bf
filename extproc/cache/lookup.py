"""The interface a response store implements (SQLite, Redis): entries by exact key, and the
vectors of semantic entries in the order they were stored, which each process's index reads
(`vectors_since`: everything at start, then what is new)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from adapters.internal import ChatRequest
from extproc.cache.entry import Entry


@dataclass(frozen=True, slots=True)
class Probe:
    """What a lookup is asked: the exact key, and (for a semantic layer) the request and scope."""

    key: str
    model: str
    scope: str
    max_age_s: float | None = None
    request: ChatRequest | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class VectorRow:
    """A semantic entry's vector as the store holds it (float32 bytes)."""

    key: str
    partition: str
    expires_at: float
    vector: bytes


@dataclass(frozen=True, slots=True)
class StoreStats:
    entries: int
    bytes: int
    max_bytes: int
    by_model: dict[str, int]
    by_tenant: dict[str, int]


class ResponseLookup(Protocol):
    async def get(self, probe: Probe, now: float) -> Entry | None: ...

    def put(self, entry: Entry) -> None: ...  # queued: the write happens off the event loop

    async def stats(self) -> StoreStats: ...

    async def purge(self, tenant: str | None = None, model: str | None = None) -> int: ...

    async def vectors_since(self, cursor: str | None, now: float) -> tuple[list[VectorRow], str]:
        """Live vectors stored after `cursor` (None: all of them), and the cursor to ask from next."""
        ...

    async def close(self) -> None: ...
