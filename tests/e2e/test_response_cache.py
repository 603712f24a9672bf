"""The response cache through a real Envoy (issue 39): a hit answers from the request-body step
(the demo upstream's request counter does not move), in the caller's protocol, plain or as a
stream its SDK parses; tenants never read each other's entries; Cache-Control steers it; errors
and cut streams are never kept; TTLs expire; two extproc replicas share entries in Redis."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from controlplane.environments import EnvironmentConfig
from keys.secret import digest_of
from tests.conftest import DEMO_KEY
from tests.e2e.metered import metered_row
from tests.e2e.semantic_stack import semantic_config
from tests.ratelimit.redis_server import REDIS_BIN, RedisServer
from tests.stack_config import add_extproc_replica, small_config, start_stack

pytestmark = pytest.mark.e2e
L2_KEY = "sk-modelyard-demo-l2"
ADMIN_KEY = "adm-rcache-admin-key"
CACHED = {"mode": "exact", "ttl_s": 600, "scope": "tenant"}
SHORT_TTL_S = 1.0


def _config(tmp: Path, **store: object) -> dict:
    data = small_config()
    base = data["models"][0]
    base["deployments"][0].pop("warmup", None)  # the upstream's counter counts the tests' calls only
    data["models"] += [{**base, "name": "demo-gpt-cached", "cache": CACHED},
                       {**base, "name": "demo-gpt-brief", "cache": {**CACHED, "ttl_s": SHORT_TTL_S}}]
    data["extproc"]["metering_db"] = str(tmp / "metering.sqlite")
    data["response_cache"] = {"sqlite_path": str(tmp / "rcache.sqlite"), **store}
    return data


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rcache")
    data = _config(tmp)
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)]}  # the admin API needs the key store (run/keys.db)
    with start_stack(tmp, data) as s:
        s.data = data
        yield s


def _upstream_calls(data: dict) -> int:
    ep = data["models"][0]["deployments"][0]["endpoints"][0]
    return httpx.get(f"http://{ep}/stats", timeout=5).json()["requests"]


def _oai(stack, key: str = DEMO_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0)


def _ask(stack, text: str, *, key: str = DEMO_KEY, model: str = "demo-gpt-cached", headers: dict | None = None):
    raw = _oai(stack, key).chat.completions.with_raw_response.create(
        model=model, max_tokens=64, messages=[{"role": "user", "content": text}], extra_headers=headers or {})
    return raw.headers.get("x-modelyard-cache"), raw.parse(), raw.headers


def _unique(label: str) -> str:
    return f"{label} {uuid.uuid4().hex[:8]}"


def _stored(stack, timeout: float = 5.0) -> None:
    """Wait until the writer thread has committed one more entry (the store is read back by the test)."""
    path = stack.data["response_cache"]["sqlite_path"]
    deadline = time.monotonic() + timeout
    before = getattr(stack, "_entries", 0)
    while True:
        with sqlite3.connect(path) as conn:
            n = conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        if n > before:
            stack._entries = n
            return
        assert time.monotonic() < deadline, "no entry stored"
        time.sleep(0.02)


def test_miss_then_hit_without_an_upstream_call_and_metered_as_a_hit(stack) -> None:
    text = _unique("cache me")
    verdict, first, _ = _ask(stack, text)
    assert verdict == "miss" and first.choices[0].message.content == f"[demo-openai] echo: {text}"
    _stored(stack)
    calls = _upstream_calls(stack.data)
    verdict, second, headers = _ask(stack, text)
    assert verdict == "hit"
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage.prompt_tokens == first.usage.prompt_tokens
    assert _upstream_calls(stack.data) == calls  # the upstream never saw the second call
    row = metered_row(stack, headers["x-modelyard-task-id"])
    assert row[:3] == ("demo-gpt-cached", "demo-openai", 200) and row[5] == 0  # no upstream cost
    with sqlite3.connect(stack.cfg.extproc.metering_db) as conn:
        hit, saved = conn.execute("SELECT response_cache_hit, cache_saved FROM requests WHERE task_id = ?",
                                  (headers["x-modelyard-task-id"],)).fetchone()
    u = first.usage
    assert hit == 1 and saved == pytest.approx((u.prompt_tokens * 2.5 + u.completion_tokens * 10.0) / 1000)


def test_one_entry_serves_the_anthropic_sdk_and_streams_parse_like_live_ones(stack) -> None:
    text = _unique("any protocol")
    assert _ask(stack, text)[0] == "miss"
    _stored(stack)
    calls = _upstream_calls(stack.data)
    claude = anthropic.Anthropic(base_url=stack.url, api_key=DEMO_KEY, max_retries=0)
    raw = claude.messages.with_raw_response.create(model="demo-gpt-cached", max_tokens=64,
                                                   messages=[{"role": "user", "content": text}])
    assert raw.headers["x-modelyard-cache"] == "hit"
    assert raw.parse().content[0].text == f"[demo-openai] echo: {text}"
    with claude.messages.stream(model="demo-gpt-cached", max_tokens=64,
                                messages=[{"role": "user", "content": text}]) as s:
        assert s.response.headers["x-modelyard-cache"] == "hit"
        assert s.response.headers["content-type"].startswith("text/event-stream")
        msg = s.get_final_message()
    assert msg.content[0].text == f"[demo-openai] echo: {text}" and msg.stop_reason == "end_turn"
    raw = _oai(stack).chat.completions.with_raw_response.create(
        model="demo-gpt-cached", max_tokens=64, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": text}])
    assert raw.headers["x-modelyard-cache"] == "hit"
    chunks = list(raw.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == f"[demo-openai] echo: {text}"
    assert [c.usage for c in chunks if c.usage is not None][0].completion_tokens > 0
    assert _upstream_calls(stack.data) == calls


def test_a_live_stream_is_kept_whole_and_replayed(stack) -> None:
    text = _unique("streamed first")
    raw = _oai(stack).chat.completions.with_raw_response.create(
        model="demo-gpt-cached", max_tokens=64, stream=True, messages=[{"role": "user", "content": text}])
    assert raw.headers["x-modelyard-cache"] == "miss"
    assert "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices).endswith(text)
    _stored(stack)
    verdict, plain, _ = _ask(stack, text)
    assert verdict == "hit" and plain.choices[0].message.content == f"[demo-openai] echo: {text}"


def test_tenants_never_read_each_other_s_entries(stack) -> None:
    text = _unique("tenant a only")
    assert _ask(stack, text)[0] == "miss"
    _stored(stack)
    calls = _upstream_calls(stack.data)
    assert _ask(stack, text, key=L2_KEY)[0] == "miss"  # tenant demo-l2: its own call upstream
    assert _upstream_calls(stack.data) == calls + 1
    _stored(stack)  # and its own entry beside tenant demo's


def test_cache_control_no_store_no_cache_max_age(stack) -> None:
    text = _unique("controlled")
    assert _ask(stack, text, headers={"cache-control": "no-store"})[0] == "bypass"
    assert _ask(stack, text)[0] == "miss"
    _stored(stack)
    calls = _upstream_calls(stack.data)
    assert _ask(stack, text, headers={"cache-control": "no-store"})[0] == "bypass"
    assert _ask(stack, text, headers={"cache-control": "no-cache"})[0] == "miss"  # revalidated upstream
    assert _upstream_calls(stack.data) == calls + 2
    assert _ask(stack, text, headers={"cache-control": "max-age=3600"})[0] == "hit"
    assert _ask(stack, text, headers={"cache-control": "max-age=0"})[0] == "miss"  # any entry is older


def test_hot_sampling_bypasses_and_errors_are_never_kept(stack) -> None:
    oai = _oai(stack)
    raw = oai.chat.completions.with_raw_response.create(
        model="demo-gpt-cached", temperature=0.8, messages=[{"role": "user", "content": _unique("hot")}])
    assert raw.headers["x-modelyard-cache"] == "bypass"
    text = _unique("demo-fail-500")  # the demo upstream answers 500 (devstack/demo/faults.py)
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as e:
            _ask(stack, text)
        assert e.value.status_code == 502 and e.value.response.headers["x-modelyard-cache"] == "miss"
    text = _unique("demo-cut-stream")  # the stream stops halfway, no terminator: never kept
    calls = _upstream_calls(stack.data)
    for _ in range(2):
        raw = oai.chat.completions.with_raw_response.create(
            model="demo-gpt-cached", max_tokens=64, stream=True, messages=[{"role": "user", "content": text}])
        assert raw.headers["x-modelyard-cache"] == "miss"
        with contextlib.suppress(openai.APIError):  # the SDK may say the stream broke; the point is the next call
            list(raw.parse())
    assert _upstream_calls(stack.data) == calls + 2


def test_entries_expire_after_their_ttl(stack) -> None:
    text = _unique("brief")
    assert _ask(stack, text, model="demo-gpt-brief")[0] == "miss"
    _stored(stack)
    assert _ask(stack, text, model="demo-gpt-brief")[0] == "hit"
    time.sleep(SHORT_TTL_S)  # the TTL itself is what is tested: past it the entry is gone
    assert _ask(stack, text, model="demo-gpt-brief")[0] == "miss"


def test_models_without_a_policy_carry_no_verdict(stack) -> None:
    verdict, _, _ = _ask(stack, _unique("plain"), model="demo-gpt")
    assert verdict is None


def test_admin_api_stats_and_purge(stack) -> None:
    text = _unique("purge me")
    assert _ask(stack, text, key=L2_KEY)[0] == "miss"
    _stored(stack)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    assert httpx.get(f"{stack.url}/admin/v1/cache", timeout=10).status_code == 401
    stats = httpx.get(f"{stack.url}/admin/v1/cache", headers=admin, timeout=10).json()
    assert stats["by_tenant"]["demo-l2"] >= 1 and stats["entries"] >= stats["by_tenant"]["demo-l2"]
    r = httpx.delete(f"{stack.url}/admin/v1/cache?tenant=demo-l2", headers=admin, timeout=10)
    assert r.status_code == 200 and r.json()["purged"] == stats["by_tenant"]["demo-l2"]
    assert "demo-l2" not in httpx.get(f"{stack.url}/admin/v1/cache", headers=admin, timeout=10).json()["by_tenant"]
    stack._entries -= r.json()["purged"]
    assert _ask(stack, text, key=L2_KEY)[0] == "miss"
    _stored(stack)


def test_two_replicas_share_entries_in_redis(tmp_path: Path) -> None:
    if not os.path.exists(REDIS_BIN):
        pytest.skip("redis-server not installed")
    redis_srv = RedisServer()
    redis_srv.start()
    try:
        data = _config(tmp_path, store="redis", redis_url=redis_srv.url)
        data["models"] += semantic_config(tmp_path)["models"][1:]  # demo-gpt-semantic and its demo-embed
        data["models"][-2]["deployments"] = data["models"][0]["deployments"]
        stack = start_stack(tmp_path, data, EnvironmentConfig(name="t", admin=None, concurrency=1))
        second, second_metrics = add_extproc_replica(stack, data, tmp_path)
        stack.env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                                      extproc_endpoints=[data["extproc"]["address"], second])
        with stack:
            stack.data = data
            text = _unique("shared by replicas")
            assert _ask(stack, text)[0] == "miss"
            import redis

            r = redis.Redis.from_url(redis_srv.url)
            deadline = time.monotonic() + 5
            while not r.zcard("modelyard:rcache:index"):
                assert time.monotonic() < deadline, "no entry in Redis"
                time.sleep(0.02)
            calls = _upstream_calls(data)
            # Round robin over the two replicas: of four calls, two reach the one that did not store it.
            assert [_ask(stack, text)[0] for _ in range(4)] == ["hit"] * 4
            assert _upstream_calls(data) == calls
            metrics = {addr: httpx.get(f"http://{addr}/metrics", timeout=5).text
                       for addr in (data["extproc"]["metrics_address"], second_metrics)}
            hits = {a: _sample(m, 'modelyard_response_cache_requests_total{model="demo-gpt-cached",result="hit"}')
                    for a, m in metrics.items()}
            stored = {a: _sample(m, 'modelyard_response_cache_stored_total{model="demo-gpt-cached"}')
                      for a, m in metrics.items()}
            assert sum(stored.values()) == 1 and sum(hits.values()) == 4
            storer = next(a for a, n in stored.items() if n == 1)
            assert all(hits[a] >= 1 for a in hits if a != storer)  # a hit on the replica that never stored it
            # Semantic entries too: the vector in Redis reaches the other replica's index (its stream).
            assert _ask(stack, "Which planet is the largest?", model="demo-gpt-semantic")[0] == "miss"
            deadline = time.monotonic() + 10
            while not all(_sample(httpx.get(f"http://{a}/metrics", timeout=5).text,
                                  "modelyard_response_cache_semantic_index_rows") >= 1 for a in metrics):
                assert time.monotonic() < deadline, "the vector never reached both replicas' indexes"
                time.sleep(0.05)
            calls = _upstream_calls(data)
            got = [_ask(stack, "which planet is the largest", model="demo-gpt-semantic")[0] for _ in range(4)]
            assert got == ["semantic;score=1.00"] * 4 and _upstream_calls(data) == calls
    finally:
        redis_srv.stop()


def _sample(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
