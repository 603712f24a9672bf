"""The semantic response cache's parts, directly: the vector index, the partition and text, the
config's refusals, the demo embedder's similarity, the SQLite store's vectors and the index rebuilt
from them, and `ResponseCache`'s semantic lookup against the demo embedder served over HTTP."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from aiohttp import web

from adapters import anthropic, openai
from adapters.internal import ChatResponse, Usage
from contracts.config import parse_config
from contracts.errors import ConfigError
from devstack.demo.behaviour import demo_embedding
from devstack.demo.openai_server import make_app
from extproc.cache.entry import Entry
from extproc.cache.key import extras
from extproc.cache.part import ResponseCache
from extproc.cache.semantic import SemanticIndex
from extproc.cache.semantic_key import semantic_probe
from extproc.cache.sqlite_store import SqliteResponseStore
from extproc.cache.vector_index import VectorIndex
from tests.stack_config import free_port, small_config

SEMANTIC = {"mode": "semantic", "embedding_model": "demo-embed", "embedding_dimensions": 256, "threshold": 0.85}


def _unit(rng: np.random.Generator, dim: int = 16) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float32)
    return v / np.linalg.norm(v)


# -- the index -----------------------------------------------------------------------------------
def test_index_finds_the_nearest_row_of_its_partition_only() -> None:
    rng = np.random.default_rng(1)
    idx = VectorIndex()
    rows = [_unit(rng) for _ in range(50)]
    for i, r in enumerate(rows):
        idx.add("p", f"k{i}", r * 3.0, 1e12)  # not unit: normalized on the way in
    idx.add("other", "x", rows[7], 1e12)
    m = idx.search("p", rows[7] + 0.01 * _unit(rng), 0.0)
    assert m is not None and m.key == "k7" and m.score > 0.99
    assert idx.search("nope", rows[7], 0.0) is None
    assert idx.search("p", np.zeros(16, np.float32), 0.0) is None  # a zero vector matches nothing
    assert idx.search("p", rows[7][:8], 0.0) is None  # another dimension: never compared
    assert not idx.add("p", "bad", np.zeros(16), 1e12)
    assert len(idx) == 51


def test_index_removes_expires_and_grows_without_losing_keys() -> None:
    rng = np.random.default_rng(2)
    idx = VectorIndex()
    rows = [_unit(rng) for _ in range(100)]  # several growths (16 rows at first)
    for i, r in enumerate(rows):
        idx.add("p", f"k{i}", r, 100.0 if i % 3 == 0 else 1e12)
    for i in range(0, 100, 5):
        idx.remove(f"k{i}")
    idx.add("p", "late", _unit(rng), 1e12)  # a growth after removals compacts the dead rows away
    for i, r in enumerate(rows):
        m = idx.search("p", r, 50.0)
        if i % 5 == 0:
            assert m is None or m.key != f"k{i}"
        else:
            assert m is not None and m.key == f"k{i}"
    assert idx.search("p", rows[3], 200.0).key != "k3"  # past its expiry: skipped
    gone = idx.expire(200.0)
    assert gone == len([i for i in range(100) if i % 3 == 0 and i % 5 != 0])
    assert idx.rows("p") == len(idx) == 100 - 20 - gone + 1
    idx.add("p", "k1", rows[2], 1e12)  # the same key again: one row, the new vector
    assert idx.search("p", rows[2], 0.0).key in ("k1", "k2") and len(idx) == 100 - 20 - gone + 1


def test_a_full_partition_drops_the_row_closest_to_expiry() -> None:
    rng = np.random.default_rng(4)
    idx = VectorIndex(max_rows=3)
    rows = [_unit(rng) for _ in range(4)]
    for i, (r, exp) in enumerate(zip(rows, (300.0, 100.0, 200.0, 400.0), strict=True)):
        idx.add("p", f"k{i}", r, exp)
    idx.add("q", "other", rows[1], 100.0)  # another partition: its own bound
    assert idx.rows("p") == 3 and idx.expires_of("k1") is None  # k1 expired soonest: it went
    assert [idx.search("p", r, 0.0).key for r in (rows[0], rows[2], rows[3])] == ["k0", "k2", "k3"]
    assert idx.search("q", rows[1], 0.0).key == "other"


# -- what is compared ----------------------------------------------------------------------------
def _probe(body: dict, protocol: str = "openai", scope: str = "tenant:a", model: str = "m", dims: int | None = 256):
    mod = openai if protocol == "openai" else anthropic
    raw = orjson.dumps(body)
    return semantic_probe(mod.parse_request(raw), model=model, scope_id=scope, extra=extras(protocol, body),
                          embedder="demo-embed", dimensions=dims)


def _chat(text: str, **more: object) -> dict:
    return {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": text}], **more}


def test_the_partition_is_everything_but_the_last_message_s_text() -> None:
    p = _probe(_chat("What is the capital of France?"))
    assert p is not None and p.text == "What is the capital of France?"
    assert _probe(_chat("what's France's capital")).partition == p.partition
    assert _probe(_chat("What is the capital of France?", stream=True)).partition == p.partition
    assert _probe(_chat("What is the capital of France?"), "anthropic").partition == p.partition
    for other in (_probe(_chat("x"), scope="tenant:b"), _probe(_chat("x"), model="m2"), _probe(_chat("x"), dims=8),
                  _probe(_chat("x", temperature=0)), _probe(_chat("x", max_tokens=65)),
                  _probe(_chat("x", frequency_penalty=0.5)),
                  _probe(_chat("x", tools=[{"type": "function", "function": {"name": "f"}}])),
                  _probe({"model": "m", "max_tokens": 64, "messages": [{"role": "system", "content": "be terse"},
                                                                       {"role": "user", "content": "x"}]}),
                  _probe({"model": "m", "max_tokens": 64, "messages": [
                      {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
                      {"role": "user", "content": "x"}]})):
        assert other is not None and other.partition != p.partition


def test_only_a_plain_user_text_last_message_is_matched_by_similarity() -> None:
    img = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    assert _probe({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "what is it"}, img]}]}) is None
    assert _probe({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                              "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "sunny"}]}) is None
    assert _probe(_chat("   ")) is None


def test_the_demo_embedder_places_paraphrases_close_and_other_questions_far() -> None:
    def cos(a: str, b: str) -> float:
        x, y = np.array(demo_embedding(a, 256)), np.array(demo_embedding(b, 256))
        return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))

    base = "What is the capital of France?"
    assert cos(base, "what is the capital of france") > 0.99  # case and punctuation
    assert cos(base, "What was the capital of France?") > 0.85  # a word changed
    assert cos(base, "What is the capital of Spain?") < 0.85  # the word that changes the answer
    assert cos(base, "Tell me a joke about cats") < 0.3
    v = demo_embedding(base, 256)
    assert all(float(np.float32(x)) == x for x in v)  # exact in float32: base64 and JSON alike


# -- config --------------------------------------------------------------------------------------
def _cfg(cache: object, embed: bool = True) -> dict:
    data = small_config()
    data["models"][0]["cache"] = cache
    if embed:
        data["models"].append({"name": "demo-embed", "task_types": ["embedding"], "deployments": [
            {"cluster": "demo-openai-mini", "protocol": "openai", "endpoints": ["127.0.0.1:1"]}]})
    return data


@pytest.mark.parametrize(("cache", "embed", "says"), [
    ({**SEMANTIC, "embedding_model": "nope"}, True,
     "models[0].cache.embedding_model: unknown model 'nope' (embedding models here: demo-embed)"),
    ({**SEMANTIC, "embedding_model": "demo-gpt"}, True,
     "models[0].cache.embedding_model: 'demo-gpt' has no embedding deployment"),
    (SEMANTIC, False, "unknown model 'demo-embed' (embedding models here: none)"),
    ({**SEMANTIC, "threshold": 0}, True, "threshold 0.0 is outside (0, 1]"),
    ({**SEMANTIC, "threshold": 1.5}, True, "threshold 1.5 is outside (0, 1]"),
    ({"mode": "semantic", "threshold": 0.9}, True, "mode semantic needs embedding_model"),
    ({"mode": "exact", "threshold": 0.9}, True, "threshold is for mode: semantic"),
])
def test_bad_semantic_config_is_refused_at_load(cache: dict, embed: bool, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_cfg(cache, embed))
    assert says in e.value.message


def test_the_shipped_semantic_model_loads() -> None:
    cfg = parse_config(_cfg(SEMANTIC))
    assert cfg.models[0].cache is not None and cfg.models[0].cache.similarity == 0.85


# -- the store's vectors and the index rebuilt from them ----------------------------------------
async def test_an_index_rebuilds_from_the_sqlite_store_and_follows_purges(tmp_path: Path) -> None:
    store = SqliteResponseStore(tmp_path / "c.sqlite", max_bytes=1 << 20)
    rng = np.random.default_rng(3)
    now = time.time()
    rows = [_unit(rng) for _ in range(20)]
    for i, r in enumerate(rows):
        store.put(Entry(f"k{i}", "a" if i < 10 else "b", "m", now, now + (0.5 if i == 19 else 100), b"{}",
                        "part-a" if i < 10 else "part-b", r.tobytes()))
    store.put(Entry("exact-only", "a", "m", now, now + 100, b"{}"))
    await asyncio.to_thread(store.flush)
    other = SemanticIndex(store)  # another worker's index: everything, from the file
    assert await other.refresh() == 20
    assert other.index.search("part-a", rows[4], now).key == "k4"
    assert other.index.search("part-b", rows[4], now).key != "k4"  # partitions never mix
    assert other.index.search("part-b", rows[19], now + 1).key != "k19"  # expired
    store.put(Entry("k20", "a", "m", now, now + 100, b"{}", "part-a", rows[0].tobytes()))
    await asyncio.to_thread(store.flush)
    assert await other.refresh() == 1  # only what is new
    assert await store.purge(tenant="a") == 12
    fresh = SemanticIndex(store)
    await fresh.refresh()
    assert fresh.index.rows("part-a") == 0 and fresh.index.rows("part-b") == 10
    await other.close()
    await fresh.close()
    await store.close()


def test_eviction_counts_vectors_and_takes_them_along(tmp_path: Path) -> None:
    async def run() -> None:
        store = SqliteResponseStore(tmp_path / "c.sqlite", max_bytes=64 * 1024)
        now = time.time()
        vec = np.ones(1024, np.float32).tobytes()  # 4 kB each, plus 6 kB of answer: 10 kB an entry
        for i in range(8):  # 80 kB into a 64 kB bound: the two closest to expiry go, vectors too
            store.put(Entry(f"k{i}", "a", "m", now, now + 100 + i, b"x" * 6000, "p", vec))
        await asyncio.to_thread(store.flush)
        rows, _ = await store.vectors_since(None, now)
        assert sorted(r.key for r in rows) == [f"k{i}" for i in range(2, 8)]
        assert (await store.stats()).bytes == 6 * 10_096
        await store.close()
    asyncio.run(run())


# -- ResponseCache's semantic lookup, the demo embedder over HTTP -------------------------------
async def test_semantic_lookup_hits_above_the_threshold_and_stores_misses_with_their_vector(tmp_path: Path) -> None:
    port = free_port()
    runner = web.AppRunner(make_app("demo-openai-mini"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    data = _cfg(SEMANTIC)
    data["models"][1]["deployments"][0]["endpoints"] = [f"127.0.0.1:{port}"]
    data["response_cache"] = {"sqlite_path": str(tmp_path / "c.sqlite")}
    cfg = parse_config(data)
    cache = ResponseCache.from_config(cfg)
    assert cache is not None
    policy, embedder = cfg.models[0].cache, cfg.models[1]

    async def begin(text: str, tenant: str = "a", control: str | None = None):
        body = orjson.dumps(_chat(text))
        return await cache.begin(policy, "demo-gpt", tenant, None, "openai", openai.parse_request(body), body,
                                 control, embedder)

    try:
        first = await begin("What is the capital of France?")
        assert first.verdict == "miss" and first.vector is not None and first.vector.shape == (256,)
        cache.keep(first, ChatResponse("r1", "demo-gpt", "Paris.", (), "stop", Usage(7, 1)))
        await asyncio.to_thread(cache.store.flush)
        same = await begin("What is the capital of France?")
        assert same.header == ("x-modelyard-cache", "hit")  # exact first
        near = await begin("what was the capital of france")
        assert near.verdict == "semantic" and near.hit is not None and near.hit.content == "Paris."
        assert near.header[1].startswith("semantic;score=0.") and 0.85 <= near.score < 1
        assert (await begin("What is the capital of Spain?")).verdict == "miss"  # below the threshold
        assert (await begin("what was the capital of france", tenant="b")).verdict == "miss"  # another scope
        assert (await begin("what was the capital of france", control="no-cache")).verdict == "miss"
        assert (await begin("what was the capital of france", control="no-store")).verdict == "bypass"
    finally:
        await cache.close()
        await runner.cleanup()


# -- a reload that brings the first policy ----------------------------------------------------------
async def test_a_reload_that_adds_the_first_cache_policy_opens_the_store(tmp_path: Path) -> None:
    import copy

    from extproc.gateway import Gateway, LiveGateway
    from extproc.live.reload import Reloader

    data = _cfg(None)
    data["response_cache"] = {"sqlite_path": str(tmp_path / "c.sqlite")}
    live = LiveGateway(Gateway.build(parse_config(data)), "v1")
    assert live.current.response_cache is None  # no policy: nothing opened
    cached = copy.deepcopy(data)
    cached["models"][0]["cache"] = SEMANTIC
    out = Reloader(live).apply(parse_config(cached), version="v2", source="test")
    assert out.ok and live.current.response_cache is not None
    assert (tmp_path / "c.sqlite").exists()
    await live.current.response_cache.close()


async def test_redis_vectors_rebuild_from_the_hashes_then_follow_the_stream() -> None:
    import os

    from extproc.cache.redis_store import RedisResponseStore
    from tests.ratelimit.redis_server import REDIS_BIN, RedisServer

    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    server = RedisServer()
    server.start()
    try:
        store = RedisResponseStore(server.url, "t:", 1 << 20)
        rng = np.random.default_rng(5)
        now = time.time()
        rows = [_unit(rng) for _ in range(3)]
        store.put(Entry("k0", "a", "m", now, now + 100, b"{}", "p", rows[0].tobytes()))
        store.put(Entry("exact", "a", "m", now, now + 100, b"{}"))
        await store.flush()
        index = SemanticIndex(store)  # a replica starting: the live entries' vectors, then the stream
        assert await index.refresh() == 1 and index.index.search("p", rows[0], now).key == "k0"
        store.put(Entry("k1", "a", "m", now, now + 100, b"{}", "p", rows[1].tobytes()))
        store.put(Entry("k0", "a", "m", now, now + 100, b"{}"))  # k0 answered again without a vector
        await store.flush()
        assert await index.refresh() == 1  # k1 from the stream
        assert index.index.search("p", rows[1], now).key == "k1"
        fresh = SemanticIndex(store)
        await fresh.refresh()
        assert len(fresh.index) == 1  # k0's hash holds no vector any more: only k1
        assert await store.purge(tenant="a") == 3
        await index.close()
        await fresh.close()
        await store.close()
    finally:
        server.stop()
