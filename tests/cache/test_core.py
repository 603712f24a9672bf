"""The response cache's pure parts: key, policy, entry codec, stream replay and assembly; the
config's checks; the SQLite store with a real file."""

from __future__ import annotations

import asyncio
import time

import pytest

from adapters import anthropic, openai
from adapters.internal import (
    CacheTokens,
    ChatResponse,
    ReasoningPart,
    StreamError,
    StreamStart,
    TextDelta,
    ToolCall,
    Usage,
)
from contracts.config import parse_config
from contracts.config.response_cache import CachePolicy
from contracts.errors import ConfigError
from extproc.cache import entry
from extproc.cache.entry import Entry
from extproc.cache.key import extras, request_key
from extproc.cache.lookup import Probe
from extproc.cache.policy import fresh, parse_cache_control, refusal, scope_id
from extproc.cache.replay import Assembly, events
from extproc.cache.sqlite_store import SqliteResponseStore
from tests.stack_config import small_config

POLICY = CachePolicy()


def _key(body: bytes, protocol: str = "openai", scope: str = "tenant:a", model: str = "m") -> str:
    mod = openai if protocol == "openai" else anthropic
    import orjson

    return request_key(mod.parse_request(body), model=model, scope_id=scope, extra=extras(protocol, orjson.loads(body)))


OAI = b'{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'


def test_key_ignores_stream_and_protocol_but_not_the_answer_s_inputs() -> None:
    k = _key(OAI)
    assert k == _key(b'{"model":"m","max_tokens":64,"stream":true,"stream_options":{"include_usage":true},'
                     b'"messages":[{"role":"user","content":"hi"}]}')
    # The same call in Anthropic's protocol: one entry serves both.
    assert k == _key(b'{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}', "anthropic")
    for other in (b'{"model":"m","max_tokens":65,"messages":[{"role":"user","content":"hi"}]}',
                  b'{"model":"m","max_tokens":64,"temperature":0,"messages":[{"role":"user","content":"hi"}]}',
                  b'{"model":"m","max_tokens":64,"messages":[{"role":"user","content":"hi!"}]}',
                  b'{"model":"m","max_tokens":64,"frequency_penalty":0.5,"messages":[{"role":"user","content":"hi"}]}',
                  b'{"model":"m","max_tokens":64,"response_format":{"type":"json_object"},'
                  b'"messages":[{"role":"user","content":"hi"}]}',
                  b'{"model":"m","max_tokens":64,"tools":[{"type":"function","function":{"name":"f"}}],'
                  b'"messages":[{"role":"user","content":"hi"}]}'):
        assert _key(other) != k, other
    assert _key(OAI, scope="tenant:b") != k
    assert _key(OAI, model="m2") != k


def test_cache_control() -> None:
    assert parse_cache_control(None) == parse_cache_control("") == parse_cache_control("private")
    c = parse_cache_control("no-store")
    assert (c.read, c.write) == (False, False)
    c = parse_cache_control("No-Cache")
    assert (c.read, c.write) == (False, True)
    c = parse_cache_control("max-age=30, foo")
    assert (c.read, c.write, c.max_age_s) == (True, True, 30.0)
    assert parse_cache_control("max-age=soon").max_age_s is None


def test_policy_refusals_and_scopes() -> None:
    hot = openai.parse_request(b'{"model":"m","temperature":0.7,"messages":[{"role":"user","content":"x"}]}')
    assert refusal(POLICY, hot, {}) == "temperature above zero"
    assert refusal(CachePolicy(temperature_above_zero=True), hot, {}) is None
    cold = openai.parse_request(OAI)
    assert refusal(POLICY, cold, {"n": 2}) == "n set"
    assert refusal(POLICY, cold, {"n": 1}) is None
    assert scope_id(POLICY, "a", None) == "tenant:a"
    assert scope_id(CachePolicy(scope="key"), "a", None) is None  # a config-file key: no id, no sharing
    assert scope_id(CachePolicy(scope="key"), "a", "k1") == "key:k1"
    assert scope_id(CachePolicy(scope="shared"), "a", None) == "shared"
    assert fresh(100.0, 200.0, 150.0, None) and not fresh(100.0, 200.0, 200.0, None)
    assert fresh(100.0, 200.0, 150.0, 50) and not fresh(100.0, 200.0, 150.0, 49)


RESP = ChatResponse("id-1", "m", "hello there", (ToolCall("c1", "f", '{"a": 1}'),), "tool_calls",
                    Usage(10, 5, CacheTokens(read=4)), None, None, (ReasoningPart("think", "sig"),))


def test_entry_codec_round_trips() -> None:
    assert entry.decode(entry.encode(RESP)) == RESP


def test_replayed_events_assemble_back_and_cut_streams_do_not() -> None:
    a = Assembly()
    a.feed(events(RESP))
    assert a.response() == RESP
    cut = Assembly()
    cut.feed(events(RESP)[:-1])  # no end
    assert cut.response() is None
    failed = Assembly()
    failed.feed([StreamStart("i", "m"), TextDelta("x"), StreamError("boom")])
    assert failed.response() is None


def test_replay_renders_in_each_protocol() -> None:
    req = openai.parse_request(OAI)
    sse = openai.StreamEncoder(model="m", request=req).encode(events(RESP))
    assert b"hello there" in sse and sse.rstrip().endswith(b"data: [DONE]")
    sse = anthropic.StreamEncoder(model="m", request=req).encode(events(RESP))
    assert b"message_stop" in sse


def _cfg(cache: object) -> dict:
    data = small_config()
    data["models"][0]["cache"] = cache
    return data


@pytest.mark.parametrize(("cache", "says"), [
    ({"ttl_s": 0}, "models[0].cache.ttl_s: Input should be greater than 0"),
    ({"scope": "team"}, "unknown scope 'team' (tenant, key or shared)"),
    ({"mode": "semantic"}, "mode semantic needs embedding_model"),
    ({"mode": "fuzzy"}, "unknown mode 'fuzzy'"),
    ({"max_entry_bytes": 10}, "models[0].cache.max_entry_bytes"),
    ({"ttl": 5}, "models[0].cache.ttl: Extra inputs are not permitted"),
])
def test_bad_cache_config_is_refused_at_load(cache: object, says: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(_cfg(cache))
    assert says in e.value.message


def test_sqlite_store_keeps_evicts_and_purges(tmp_path) -> None:
    async def run() -> None:
        store = SqliteResponseStore(tmp_path / "c.sqlite", max_bytes=64 * 1024)
        now = time.time()
        body = b"x" * 10_000
        for i in range(8):  # 80 kB into a 64 kB bound: the two closest to expiry go
            store.put(Entry(f"k{i}", "a" if i % 2 else "b", "m", now, now + 100 + i, body))
        await asyncio.to_thread(store.flush)
        assert await store.get(Probe("k0", "m", "s"), now) is None
        assert await store.get(Probe("k1", "m", "s"), now) is None
        got = await store.get(Probe("k7", "m", "s"), now)
        assert got is not None and got.body == body and got.tenant == "a"
        stats = await store.stats()
        assert stats.entries == 6 and stats.by_tenant == {"a": 3, "b": 3}
        assert await store.purge(tenant="a") == 3
        assert await store.purge(model="other") == 0
        assert (await store.stats()).entries == 3
        await store.close()

    asyncio.run(run())


def test_cli_stats_and_purge(tmp_path, capsys) -> None:
    import orjson
    import yaml

    from modelyard.cli import main

    data = _cfg({"mode": "exact"})
    data["response_cache"] = {"sqlite_path": "rc.sqlite"}  # relative: beside the config file
    path = tmp_path / "modelyard.yaml"
    path.write_text(yaml.safe_dump(data))
    store = SqliteResponseStore(tmp_path / "rc.sqlite", max_bytes=1 << 20)
    now = time.time()
    for i, tenant in enumerate(("a", "a", "b")):
        store.put(Entry(f"k{i}", tenant, "demo-gpt", now, now + 60, b"{}"))
    store.flush()
    store.close_now()
    assert main(["cache", "stats", "--config", str(path)]) == 0
    got = orjson.loads(capsys.readouterr().out)
    assert got["entries"] == 3 and got["by_tenant"] == {"a": 2, "b": 1}
    assert main(["cache", "purge", "--config", str(path), "--tenant", "a"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {"purged": 2}
    assert main(["cache", "stats", "--config", str(path)]) == 0
    assert orjson.loads(capsys.readouterr().out)["by_tenant"] == {"b": 1}
