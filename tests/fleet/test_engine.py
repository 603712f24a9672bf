"""The simulated model server's scheduler (devstack/fleet/engine.py), driven step by step: decode
time grows with the batch, a prefix hit shortens prefill, the KV cache bounds what runs and
preempts past it, and the prefix cache is bounded by the same blocks (LRU)."""

from __future__ import annotations

from devstack.fleet.engine import Engine, EngineSpec, SimRequest, chain_hashes

BT = 16  # tokens per block; one token per character in these tests


def req(rid: str, text: str, out: int) -> SimRequest:
    return SimRequest(rid, chain_hashes(text, BT), len(text), out)


def run(e: Engine, limit: int = 10_000) -> list:
    steps = []
    while not e.idle:
        steps.append(e.step())
        assert len(steps) < limit
    return steps


def test_decode_step_grows_with_the_running_batch() -> None:
    spec = EngineSpec(kv_blocks=256, block_tokens=BT, decode_base_ms=10, decode_ms_per_seq=1, prefill_ms_per_token=0)
    durations = {}
    for n in (1, 8, 32):
        e = Engine(spec)
        for i in range(n):
            e.submit(req(f"{i}", f"{i:>4}" * 4, 20))
        e.step()  # prefill: every request admitted, first token out
        durations[n] = e.step().duration_ms
        assert len(e.running) == n
    assert durations == {1: 11.0, 8: 18.0, 32: 42.0}


def test_prefill_time_is_the_uncached_prompt_and_a_shared_prefix_hits() -> None:
    spec = EngineSpec(kv_blocks=256, block_tokens=BT, decode_base_ms=0, decode_ms_per_seq=0,
                      prefill_ms_per_token=1, prefill_budget=10_000)
    e = Engine(spec)
    system = "S" * (BT * 20)  # 20 full blocks
    e.submit(req("a", system + "question one", 1))
    first = e.step()
    assert first.prefill_tokens == len(system) + 12 and first.first[0].cached_tokens == 0
    run(e)
    e.submit(req("b", system + "another question", 1))
    second = e.step()
    assert second.first[0].cached_tokens == len(system)
    assert second.prefill_tokens == 16 and second.duration_ms == 16.0  # only the new tail
    assert (e.prefix_hits, e.prefix_queries) == (len(system), 2 * len(system) + 12 + 16)
    # a different start shares nothing, even with the same text later (the hashes are chained)
    e.submit(req("c", "X" * BT + system, 1))
    assert e.step().first[0].cached_tokens == 0


def test_a_fully_cached_prompt_still_computes_its_last_block() -> None:
    e = Engine(EngineSpec(kv_blocks=64, block_tokens=BT, prefill_budget=10_000))
    text = "P" * (BT * 4)
    e.submit(req("a", text, 1))
    run(e)
    e.submit(req("b", text, 1))
    out = e.step()
    assert out.first[0].cached_tokens == 3 * BT and out.prefill_tokens == BT


def test_kv_capacity_bounds_what_runs_and_the_rest_wait() -> None:
    # 10 blocks: each request needs ceil((48 + 1) / 16) = 4, so two run and the third waits
    e = Engine(EngineSpec(kv_blocks=10, block_tokens=BT, prefill_budget=10_000))
    for i in range(3):
        e.submit(req(f"{i}", chr(65 + i) * 48, 8))
    e.step()
    assert (len(e.running), len(e.waiting)) == (2, 1)
    assert e.kv_usage == 0.8
    run(e)
    assert e.finished == 3 and e.preemptions == 0 and e.kv_usage == 0.0


def test_running_past_capacity_preempts_the_newest_and_it_recomputes() -> None:
    # Two requests fit at admission (3 blocks each of 8) but grow past the cache as they decode.
    e = Engine(EngineSpec(kv_blocks=8, block_tokens=BT, prefill_budget=10_000, max_running=8))
    e.submit(req("old", "a" * 32, 60))
    e.submit(req("new", "b" * 32, 60))
    steps = run(e)
    assert e.preemptions >= 1
    assert e.finished == 2 and e.generation_tokens == 120  # recompute yields no extra tokens
    old_done = next(i for i, s in enumerate(steps) if any(r.rid == "old" for r in s.finished))
    new_done = next(i for i, s in enumerate(steps) if any(r.rid == "new" for r in s.finished))
    assert old_done < new_done  # the newest was the one preempted
    assert sum(s.prefill_tokens for s in steps) > 64  # the preempted one prefilled again
    assert e.kv_usage == 0.0


def test_the_prefix_cache_is_bounded_by_the_kv_blocks_lru_first() -> None:
    e = Engine(EngineSpec(kv_blocks=12, block_tokens=BT, prefill_budget=10_000))
    prompts = {k: k * (BT * 4) for k in "ABC"}  # 4 full blocks each (+1 to decode): 3 do not all stay cached
    for k in "AB":
        e.submit(req(k, prompts[k], 1))
        run(e)
    e.submit(req("A2", prompts["A"], 1))  # A used again: B is now the least recently used
    run(e)
    e.submit(req("C", prompts["C"], 1))  # needs blocks: evicts B's, not A's
    run(e)
    hits = []
    for k in "AB":
        e.submit(req(k + "3", prompts[k], 1))
        hits.append(e.step().first[0].cached_tokens)
        run(e)
    assert hits == [3 * BT, 0]


def test_a_cancelled_call_frees_its_blocks() -> None:
    e = Engine(EngineSpec(kv_blocks=16, block_tokens=BT))
    r = req("a", "z" * 40, 100)
    e.submit(r)
    e.step()
    assert e.kv_usage > 0
    e.cancel(r)
    assert e.idle and e.kv_usage == 0.0
