"""Prefix affinity: which replica a prompt's first blocks were last sent to.

A model server's prefix cache holds the blocks of prompts it ran; a call whose prompt starts the
same way runs faster where those blocks are. The gateway cannot see the caches, so it remembers
what it sent where: chained hashes of the prompt's first full blocks -> the replica, in a bounded
LRU. Pure; one index per deployment.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from adapters.internal import ChatRequest, TextPart


def prompt_text(req: ChatRequest) -> str:
    """The prompt as a model server's cache would see its start: system, then each turn's text."""
    out = [req.system or ""]
    for m in req.messages:
        out.append(f"\x1e{m.role}\x1f")
        out.extend(p.text for p in m.content if isinstance(p, TextPart))
    return "".join(out)


def block_hashes(text: str, block_chars: int, max_blocks: int) -> list[bytes]:
    """One chained hash per full block (each covers every block before it), at most `max_blocks`."""
    out: list[bytes] = []
    h = hashlib.blake2b(digest_size=16)
    data = text.encode("utf-8", "surrogatepass")
    for i in range(min(max_blocks, len(data) // block_chars)):
        h.update(data[i * block_chars:(i + 1) * block_chars])
        out.append(h.copy().digest())
    return out


class PrefixIndex:
    """Block hash -> the last `ways` replicas it was sent to (newest first), least recently used out
    past `max_entries`. `ways` > 1: a hot prefix spilled onto other replicas is remembered on each."""

    __slots__ = ("max_entries", "ways", "_where")

    def __init__(self, max_entries: int, ways: int = 1) -> None:
        self.max_entries = max_entries
        self.ways = ways
        self._where: OrderedDict[bytes, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._where)

    def match(self, hashes: list[bytes]) -> dict[str, int]:
        """replica -> how many of the leading blocks it was last sent (the longest match wins a tie)."""
        out: dict[str, int] = {}
        for depth, h in enumerate(hashes, 1):
            replicas = self._where.get(h)
            if replicas is None:
                break  # chained: no later block can match once one does not
            for replica in replicas:
                out[replica] = depth
        return out

    def record(self, hashes: list[bytes], replica: str) -> None:
        where = self._where
        ways = self.ways
        for h in hashes:
            old = where.get(h)
            where[h] = (replica,) if old is None or ways == 1 else (replica, *[r for r in old if r != replica][:ways - 1])
            where.move_to_end(h)
        while len(where) > self.max_entries:
            where.popitem(last=False)
