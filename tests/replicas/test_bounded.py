"""Bounded-load prefix placement (extproc/replicas/bounded.py): pure, directly and through the picker."""

from __future__ import annotations

from collections import Counter

from contracts.config.balancing import ReplicaMetrics
from extproc.replicas.bounded import bounded_affinity, load_bound, ring_order
from extproc.replicas.picker import pick_replica
from extproc.replicas.prefix import PrefixIndex, block_hashes
from extproc.replicas.readings import ReplicaReading

EPS4 = [f"10.0.0.{i}:8000" for i in range(1, 5)]
OLD = ReplicaMetrics(kind="vllm", interval_ms=50, stale_after_ms=200, load_bound=None, prefix_ways=1)
NEW = OLD.model_copy(update={"load_bound": 0.25, "prefix_ways": 4})


def test_the_bound_is_the_mean_queue_with_this_call_times_one_plus_eps() -> None:
    assert load_bound({"a": 10, "b": 2, "c": 2, "d": 2}, 0.25) == 6  # ceil(1.25 * 17 / 4)
    assert load_bound({"a": 0}, 0.0) == 1
    assert load_bound({"a": 2, "b": 0}, 0.25, floor=8) == 8  # light load: the floor (queue_scale) holds
    # The shortest queue always fits, so a spill always finds a replica.
    for qs in ({"a": 5, "b": 5, "c": 5, "d": 5}, {"a": 0, "b": 9}, {"a": 3, "b": 3, "c": 4}):
        assert min(qs.values()) + 1 <= load_bound(qs, 0.0)


def test_a_cold_prefix_stays_on_its_replica_while_within_the_bound() -> None:
    assert bounded_affinity({"a": 4}, {"a": 5, "b": 3}, b"k", 0.25) == {"a": 4}  # 6 <= ceil(1.25 * 9 / 2)
    readings = {"a": ReplicaReading(0, 5, None, 10.0), "b": ReplicaReading(0, 3, None, 10.0)}
    pick = pick_replica(NEW, ["a", "b"], readings, {}, {}, 10.0, prefix_depth={"a": 4}, prefix_blocks=4,
                        prefix_key=b"k")
    assert pick.endpoint == "a" and pick.why == "prefix"
    # Light load: two calls behind is within the floor (queue_scale 8), so a conversation stays put.
    assert bounded_affinity({"a": 4}, {"a": 2, "b": 0}, b"k", 0.25, floor=8) == {"a": 4}


def test_a_full_home_spills_to_the_next_replica_on_the_prefix_ring() -> None:
    queues = {"a": 10, "b": 2, "c": 2, "d": 2}
    ring = [ep for ep in ring_order(b"hot", list(queues)) if ep != "a"]
    assert bounded_affinity({"a": 3}, queues, b"hot", 0.25) == {ring[0]: 3}
    # A replica that already holds the prefix and fits keeps it; the full one loses it.
    assert bounded_affinity({"a": 3, "c": 2}, queues, b"hot", 0.25) == {"c": 2}
    # The ring is the prefix's own: stable, and another prefix orders the replicas otherwise.
    assert ring_order(b"hot", EPS4) == ring_order(b"hot", list(reversed(EPS4)))
    assert len({tuple(ring_order(bytes([i]), EPS4)) for i in range(16)}) > 1


def _saturate(settings: ReplicaMetrics, calls: int = 96) -> tuple[Counter[str], int]:
    """Saturation: every replica running 40, calls arriving and none finishing; 3 in 4 on one hot
    system prompt (each its own conversation), the rest cold. -> hot calls per replica, the worst
    excess of a replica's queue over the bound at the moment it was picked."""
    idx = PrefixIndex(10_000, settings.prefix_ways)
    readings = {ep: ReplicaReading(0, 40, None, 10.0) for ep in EPS4}
    in_flight: dict[str, int] = {}
    hot: Counter[str] = Counter()
    worst = -99
    system = "You are a helpful assistant. " * 40
    for i in range(calls):
        text = (system if i % 4 else f"cold {i} " * 200) + f"user {i} " * 100
        hashes = block_hashes(text, 512, 64)
        pick = pick_replica(settings, EPS4, readings, in_flight, {}, 10.0, prefix_depth=idx.match(hashes),
                            prefix_blocks=len(hashes), prefix_key=hashes[0])
        ep = pick.endpoint
        assert ep is not None
        queues = {e: 40 + in_flight.get(e, 0) for e in EPS4}
        worst = max(worst, queues[ep] + 1 - load_bound(queues, 0.25, settings.queue_scale))
        in_flight[ep] = in_flight.get(ep, 0) + 1
        idx.record(hashes, ep)
        if i % 4:
            hot[ep] += 1
    return hot, worst


def test_at_saturation_the_hot_prefix_spreads_within_the_bound_where_it_used_to_pin_one_replica() -> None:
    hot, worst = _saturate(OLD)
    assert len(hot) == 1 and worst > 0  # the old placement: every hot call on one replica, past the bound
    hot, worst = _saturate(NEW)
    assert worst <= 0  # bounded load holds at every pick
    assert len(hot) >= 2 and max(hot.values()) <= 2 * min(hot.values()) + 8


def test_the_prefix_index_remembers_the_last_ways_replicas_of_a_block() -> None:
    idx = PrefixIndex(100, ways=2)
    conv = block_hashes("abcd" * 64, 64, 8)
    idx.record(conv, "a")
    idx.record(conv[:2], "b")
    assert idx.match(conv) == {"a": 4, "b": 2}
    idx.record(conv[:2], "c")  # two ways: the oldest on the first two blocks (a) is forgotten there
    assert idx.match(conv[:2]) == {"c": 2, "b": 2}
    one = PrefixIndex(100)
    one.record(conv, "a")
    one.record(conv, "b")
    assert one.match(conv) == {"b": 4}  # one way: as before, the last replica sent to
