"""The semantic cache's nearest-neighbour index (pure NumPy): per partition, a matrix of unit float32
rows; a lookup is one matrix-vector product and an argmax (cosine similarity = dot product of unit
vectors). Exact (recall 1), deletions free, rebuilt at start by appending rows; chosen over
hnswlib/usearch/faiss by `bench/bench_semantic.py` (docs/cache.md says why).

Safe to search from a worker thread while the loop adds and removes: rows are only appended past the
count a search read, a removal only marks a row dead (its expiry 0), and a compaction builds new
arrays (a search under way keeps reading the old ones).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_INITIAL_ROWS = 16


@dataclass(frozen=True, slots=True)
class Match:
    key: str
    score: float  # cosine similarity, in [-1, 1]


class _Block:
    """One partition's rows: `mat[:count]` unit vectors, `keys[i]` the entry of row i, `expires[i]`
    its expiry (0: removed)."""

    __slots__ = ("mat", "keys", "expires", "count", "dead")

    def __init__(self, dim: int, capacity: int = _INITIAL_ROWS) -> None:
        self.mat = np.zeros((capacity, dim), np.float32)
        self.keys: list[str] = []
        self.expires = np.zeros(capacity, np.float64)
        self.count = 0
        self.dead = 0

    @property
    def dim(self) -> int:
        return int(self.mat.shape[1])


def unit(vec: np.ndarray) -> np.ndarray | None:
    """`vec` as a unit float32 row; None for a zero (or non-finite) vector, which matches nothing."""
    v = np.asarray(vec, np.float32).reshape(-1)
    n = float(np.linalg.norm(v))
    if not np.isfinite(n) or n == 0.0:
        return None
    out: np.ndarray = v / n
    return out


class VectorIndex:
    """`max_rows`: a partition's bound; past it the row closest to expiry leaves the index (its entry
    stays an exact-cache entry). It bounds a lookup's cost: rows x dimension multiply-adds."""

    def __init__(self, max_rows: int = 20_000) -> None:
        self.max_rows = max_rows
        self._blocks: dict[str, _Block] = {}
        self._where: dict[str, tuple[str, int]] = {}  # entry key -> (partition, row)

    def __len__(self) -> int:
        return len(self._where)

    def rows(self, partition: str) -> int:
        """Live rows of one partition (a search's cost: rows x dimension)."""
        b = self._blocks.get(partition)
        return 0 if b is None else b.count - b.dead

    def expires_of(self, key: str) -> float | None:
        at = self._where.get(key)
        return None if at is None else float(self._blocks[at[0]].expires[at[1]])

    @property
    def nbytes(self) -> int:
        return sum(b.mat.nbytes + b.expires.nbytes for b in self._blocks.values())

    def add(self, partition: str, key: str, vec: np.ndarray, expires_at: float) -> bool:
        """Index `vec` (normalized here) for `key`; False when it cannot be: a zero vector, or a
        dimension other than the partition's (an embedder changed under a running index)."""
        row = unit(vec)
        if row is None:
            return False
        self.remove(key)  # the same request stored again: one row per key
        b = self._blocks.get(partition)
        if b is None:
            b = self._blocks[partition] = _Block(row.shape[0])
        if row.shape[0] != b.dim:
            return False
        if b.count - b.dead >= self.max_rows:
            live = b.expires[:b.count]
            self.remove(b.keys[int(np.argmin(np.where(live > 0, live, np.inf)))])
            b = self._blocks.get(partition) or self._blocks.setdefault(partition, _Block(row.shape[0]))
        if b.count == b.mat.shape[0]:
            b = self._grown(partition, b)
        b.mat[b.count] = row
        b.expires[b.count] = expires_at
        b.keys.append(key)
        self._where[key] = (partition, b.count)
        b.count += 1
        return True

    def _grown(self, partition: str, b: _Block) -> _Block:
        """A new block with room (dead rows dropped): arrays are never resized in place."""
        live = np.nonzero(b.expires[:b.count] > 0)[0]
        new = _Block(b.dim, max(_INITIAL_ROWS, 2 * len(live) + 1))
        new.mat[:len(live)] = b.mat[live]
        new.expires[:len(live)] = b.expires[live]
        new.keys = [b.keys[i] for i in live]
        new.count = len(live)
        for i, k in enumerate(new.keys):
            self._where[k] = (partition, i)
        self._blocks[partition] = new
        return new

    def remove(self, key: str) -> None:
        at = self._where.pop(key, None)
        if at is None:
            return
        b = self._blocks[at[0]]
        b.expires[at[1]] = 0.0
        b.dead += 1
        if b.dead == b.count:
            del self._blocks[at[0]]

    def expire(self, now: float) -> int:
        """Forget rows past their expiry; how many went."""
        gone = 0
        for b in list(self._blocks.values()):
            for i in np.nonzero((b.expires[:b.count] > 0) & (b.expires[:b.count] <= now))[0]:
                self.remove(b.keys[i])
                gone += 1
        return gone

    def search(self, partition: str, vec: np.ndarray, now: float) -> Match | None:
        """The most similar live row of `partition` (expired rows skipped), or None."""
        b = self._blocks.get(partition)
        q = unit(vec)
        if b is None or q is None or q.shape[0] != b.dim:
            return None
        mat, expires, keys, n = b.mat, b.expires, b.keys, b.count  # one consistent view (see the module doc)
        if n == 0:
            return None
        scores = mat[:n] @ q
        scores[expires[:n] <= now] = -np.inf
        best = int(np.argmax(scores))
        score = float(scores[best])
        if score == -np.inf:
            return None
        return Match(keys[best], min(1.0, score))
