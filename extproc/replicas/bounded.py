"""Bounded-load prefix placement: consistent hashing with bounded loads over a prefix's replicas; pure.

At saturation prefix affinity decides, and a popular system prompt pinned every conversation on it
to the replica its first call landed on (bench_replicas --trace: 139-167 of 487 calls on one while
others idled). Here a replica keeps the prefix affinity of a call only while taking it keeps its
queue within `ceil((1 + eps) * (total + 1) / n)` (total: every fresh replica's queue); when every
replica holding the prefix is at that bound, the affinity spills to the first replica under it in
the prefix's own ring order (rendezvous hashing of its first block), so a hot prefix grows onto a
few replicas in a fixed order while a cold prefix stays where its cache is. The bound never drops
below `floor` (the picker passes `queue_scale`): at light load the queue term still tells replicas
apart, and a conversation two calls behind should stay where its cache is.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping


def load_bound(queues: Mapping[str, float], eps: float, floor: float = 0.0) -> float:
    """The most calls one replica may hold once it takes this one (the call itself counted)."""
    return max(floor, math.ceil((1.0 + eps) * (sum(queues.values()) + 1) / max(1, len(queues))))


def ring_order(key: bytes, endpoints: list[str]) -> list[str]:
    """The prefix's own order of replicas (rendezvous hashing: stable as replicas come and go)."""
    return sorted(endpoints, key=lambda ep: hashlib.blake2b(key + ep.encode(), digest_size=8).digest())


def bounded_affinity(depth: Mapping[str, int], queues: Mapping[str, float], key: bytes,
                     eps: float, floor: float = 0.0) -> dict[str, int]:
    """replica -> the prefix depth it may claim for this call: the replicas holding the prefix that
    stay within the bound, else (all full) the first under it on the prefix's ring, at the best depth."""
    if not depth:
        return {}
    bound = load_bound(queues, eps, floor)
    fits = {ep for ep, q in queues.items() if q + 1 <= bound}
    keep = {ep: d for ep, d in depth.items() if ep in fits}
    if keep:
        return keep
    best = max(depth.values())
    for ep in ring_order(key, list(queues)):
        if ep in fits:
            return {ep: best}
    return {}
