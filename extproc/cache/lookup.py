"""The interface a response store implements: the exact stores here (SQLite, Redis); a semantic
layer (an embedding index beside them) implements the same `get` over the probe's request."""

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

    async def close(self) -> None: ...
