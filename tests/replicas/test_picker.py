"""The replica picker and the prefix index: pure, on hand-made readings."""

from __future__ import annotations

from contracts.config.balancing import ReplicaMetrics
from extproc.replicas.picker import pick_replica
from extproc.replicas.prefix import PrefixIndex, block_hashes
from extproc.replicas.readings import ReplicaReading

S = ReplicaMetrics(kind="vllm", interval_ms=50, stale_after_ms=200)
EPS = ["10.0.0.1:8000", "10.0.0.2:8000"]


def _r(waiting: float = 0, running: float = 0, kv: float | None = None, at: float = 10.0, **kw) -> ReplicaReading:
    return ReplicaReading(waiting, running, kv, at, **kw)


def test_short_queue_wins_and_in_flight_counts() -> None:
    readings = {EPS[0]: _r(waiting=30), EPS[1]: _r()}
    assert pick_replica(S, EPS, readings, {}, {}, 10.0).endpoint == EPS[1]
    # Between scrapes, the gateway's own calls to b move the queue.
    assert pick_replica(S, EPS, readings, {EPS[1]: 40}, {}, 10.0).endpoint == EPS[0]


def test_kv_headroom_breaks_equal_queues() -> None:
    readings = {EPS[0]: _r(kv=0.9), EPS[1]: _r(kv=0.1)}
    pick = pick_replica(S, EPS, readings, {}, {}, 10.0)
    assert pick.endpoint == EPS[1] and "kv_cache 0.90" in pick.reason


def test_stale_or_missing_readings_fail_open() -> None:
    pick = pick_replica(S, EPS, {EPS[0]: _r(at=9.0)}, {}, {}, 10.0)
    assert pick.endpoint is None
    assert dict(pick.left_out) == {EPS[0]: "stale reading (1.000s old)", EPS[1]: "no reading"}
    # One fresh: it is picked, the other left out.
    assert pick_replica(S, EPS, {EPS[0]: _r(at=9.0), EPS[1]: _r(waiting=99)}, {}, {}, 10.0).endpoint == EPS[1]


def test_a_failed_replica_is_held_back_unless_it_is_the_only_fresh_one() -> None:
    readings = {EPS[0]: _r(), EPS[1]: _r(waiting=50)}
    assert pick_replica(S, EPS, readings, {}, {EPS[0]: 9.5}, 10.0).endpoint == EPS[1]
    assert pick_replica(S, EPS, readings, {}, {EPS[0]: 7.0}, 10.0).endpoint == EPS[0]  # past failure_hold_ms
    assert pick_replica(S, EPS, readings, {}, {EPS[0]: 9.5, EPS[1]: 9.5}, 10.0).endpoint == EPS[0]


def test_lora_loaded_beats_free_slot_beats_none() -> None:
    eps = [*EPS, "10.0.0.3:8000"]
    readings = {eps[0]: _r(loras=frozenset({"x"}), max_lora=1),
                eps[1]: _r(loras=frozenset(), max_lora=1),
                eps[2]: _r(loras=frozenset({"sql"}), max_lora=1)}
    pick = pick_replica(S, eps, readings, {}, {}, 10.0, adapter="sql")
    assert [s.endpoint for s in pick.ranked] == [eps[2], eps[1], eps[0]]
    # No adapter asked: the term is left out, ties in config order.
    assert pick_replica(S, eps, readings, {}, {}, 10.0).endpoint == eps[0]


def test_prefix_affinity_outweighs_a_small_queue_gap_not_a_deep_one() -> None:
    depth = {EPS[0]: 4}
    near = {EPS[0]: _r(waiting=2), EPS[1]: _r()}
    assert pick_replica(S, EPS, near, {}, {}, 10.0, prefix_depth=depth, prefix_blocks=4).endpoint == EPS[0]
    deep = {EPS[0]: _r(waiting=50), EPS[1]: _r()}
    assert pick_replica(S, EPS, deep, {}, {}, 10.0, prefix_depth=depth, prefix_blocks=4).endpoint == EPS[1]


def test_explain_lists_terms() -> None:
    out = pick_replica(S, EPS, {EPS[0]: _r(waiting=8), EPS[1]: _r()}, {}, {}, 10.0).explain()
    assert out["endpoint"] == EPS[1]
    # weights queue 1, kv 0.5 (prefix and lora off: no prompt blocks, no adapter): (0.5 + 0.5) / 1.5
    assert out["ranked"][1] == {"endpoint": EPS[0], "score": 0.6667, "queue_len": 8, "queue": 0.5,
                                "kv_cache": 1.0, "prefix": 0.0, "lora": 0.0}


def test_block_hashes_chain_and_only_full_blocks_count() -> None:
    a = block_hashes("x" * 100, 32, 8)
    assert len(a) == 3
    b = block_hashes("x" * 64 + "y" * 40, 32, 8)
    assert a[:2] == b[:2] and a[2] != b[2]
    assert block_hashes("short", 32, 8) == []
    assert len(block_hashes("x" * 1000, 32, 4)) == 4


def test_prefix_index_matches_the_longest_run_and_stays_bounded() -> None:
    idx = PrefixIndex(max_entries=4)
    conv = block_hashes("abcd" * 64, 64, 8)  # 4 blocks
    idx.record(conv[:2], "a")
    assert idx.match(conv) == {"a": 2}
    idx.record(conv, "b")  # sent on to b: b holds all four now
    assert idx.match(conv) == {"b": 4}
    idx.record(block_hashes("zzzz" * 64, 64, 8)[:1], "a")
    assert len(idx) == 4  # the least recently used block left
    assert idx.match(conv) == {}  # its first block was the oldest: the chain breaks there


def test_the_audit_reason_names_the_term_that_decided() -> None:
    queue = pick_replica(S, EPS, {EPS[0]: _r(waiting=30), EPS[1]: _r()}, {}, {}, 10.0)
    assert queue.audit() == {"replica": EPS[1], "reason": "queue", "score": round(queue.ranked[0].score, 4)}
    kv = pick_replica(S, EPS, {EPS[0]: _r(kv=0.9), EPS[1]: _r(kv=0.1)}, {}, {}, 10.0)
    assert kv.why == "kv_cache"
    near = {EPS[0]: _r(waiting=2), EPS[1]: _r()}
    prefix = pick_replica(S, EPS, near, {}, {}, 10.0, prefix_depth={EPS[0]: 4}, prefix_blocks=4)
    assert (prefix.endpoint, prefix.why) == (EPS[0], "prefix")
    lora = pick_replica(S, EPS, {EPS[0]: _r(max_lora=1), EPS[1]: _r(loras=frozenset({"sql"}), max_lora=1)},
                        {}, {}, 10.0, adapter="sql")
    assert (lora.endpoint, lora.why) == (EPS[1], "lora")
    assert pick_replica(S, EPS, {EPS[0]: _r(), EPS[1]: _r()}, {}, {}, 10.0).why == "tie"
    assert pick_replica(S, EPS, {EPS[1]: _r()}, {}, {}, 10.0).why == "only"
    held = pick_replica(S, EPS, {EPS[0]: _r(), EPS[1]: _r(waiting=9)}, {}, {EPS[0]: 9.9}, 10.0)
    assert (held.endpoint, held.why) == (EPS[1], "only")


def test_nothing_fresh_is_audited_as_envoys_fallback() -> None:
    pick = pick_replica(S, EPS, {EPS[0]: _r(at=1.0)}, {}, {}, 10.0)
    assert pick.audit() == {"replica": None, "reason": "stale", "fallback": "envoy"}
    assert pick.explain()["why"] == "stale"


def test_balance_gap_takes_the_prefix_from_a_replica_far_behind_the_shortest_queue() -> None:
    # Saturation: every queue deep, the level term flat; without the load bound (test_bounded.py)
    # the prefix pins the call to the hot replica ...
    unbounded = ReplicaMetrics(kind="vllm", interval_ms=50, stale_after_ms=200, load_bound=None)
    depth = {EPS[0]: 4}
    hot = {EPS[0]: _r(running=48, waiting=30), EPS[1]: _r(running=40)}
    assert pick_replica(unbounded, EPS, hot, {}, {}, 10.0, prefix_depth=depth, prefix_blocks=4).endpoint == EPS[0]
    # ... unless it is more than balance_gap calls behind: then it scores as any other.
    guard = unbounded.model_copy(update={"balance_gap": 32})
    pick = pick_replica(guard, EPS, hot, {}, {}, 10.0, prefix_depth=depth, prefix_blocks=4)
    assert pick.endpoint == EPS[1] and pick.ranked[1].terms["prefix"] == 0.0
    near = {EPS[0]: _r(running=48, waiting=10), EPS[1]: _r(running=40)}  # 18 behind: the prefix holds
    assert pick_replica(guard, EPS, near, {}, {}, 10.0, prefix_depth=depth, prefix_blocks=4).endpoint == EPS[0]
