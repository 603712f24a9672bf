"""4. Redis (the shared rate-limit buckets) stopped and restarted mid-load: `fallback` keeps
serving from local buckets, `fail_closed` refuses with 429 + retry-after (docs/ratelimit.md),
and once Redis is back the shared buckets decide again and still limit."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.chaos.figures import record, served_rps
from tests.chaos.observe import metered_rows, metric
from tests.chaos.settings import sizes
from tests.chaos.stacks import with_pinned
from tests.chaos.traffic import chat_body, load
from tests.conftest import DEMO_KEY
from tests.ratelimit.redis_server import RedisServer
from tests.stack_config import small_config, start_stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]
LIMITED = "sk-modelyard-demo-limited"
RETRY_MS = 200


def _limits(policy: str, url: str) -> dict:
    return {"backend": "redis", "redis": {"url": url, "replicas": 1, "failure_policy": policy,
                                          "timeout_ms": 100, "retry_interval_ms": RETRY_MS},
            "limits": [{"scope": "tenant", "match": "demo", "unit": "requests", "rate": 100000, "burst": 100000},
                       {"scope": "tenant", "match": "demo-limited", "unit": "requests", "rate": 0.01, "burst": 3}]}


@pytest.mark.parametrize("policy", ["fallback", "fail_closed"])
def test_redis_outage_follows_the_policy_and_buckets_recover(tmp_path, policy: str) -> None:
    sz = sizes()
    redis = RedisServer()
    redis.start()
    data = small_config(ratelimit=_limits(policy, redis.url))
    data["extproc"]["metering_db"] = "metering.sqlite"
    with_pinned(data)
    marks: dict[str, float] = {}
    servers = [redis]

    def outage() -> None:
        marks["down"] = time.monotonic()
        redis.stop()
        time.sleep(sz.load_s / 3)
        servers.append(RedisServer(redis.port))
        servers[-1].start()
        marks["up"] = time.monotonic()

    try:
        with start_stack(tmp_path, data) as stack:
            metrics = data["extproc"]["metrics_address"]
            shots = asyncio.run(load(stack.url, sz.load_s, sz.concurrency,
                                     lambda i: chat_body("demo-gpt", f"limited {i}"), during=outage, at=sz.load_s / 4))
            time.sleep(RETRY_MS / 1000 * 2)
            redis_before = metric(metrics, "modelyard_ratelimit_decisions_total", store="redis")
            limited = [httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {LIMITED}"},
                                  json=chat_body("demo-gpt", "again"), timeout=10) for _ in range(5)]
            redis_after = metric(metrics, "modelyard_ratelimit_decisions_total", store="redis")
            degraded = metric(metrics, "modelyard_ratelimit_degraded")
            errors = metric(metrics, "modelyard_ratelimit_backend_errors_total")
            rows = metered_rows(stack.cfg.extproc.metering_db, {s.task_id for s in shots if s.ok})
    finally:
        for srv in servers:
            srv.stop()
    during = [s for s in shots if marks["down"] <= s.started <= marks["up"]]
    refused = [s for s in shots if s.status == 429]
    assert errors >= 1 and during
    if policy == "fallback":
        assert [s.status for s in shots if not s.ok] == []  # local buckets kept serving
    else:
        assert refused, "fail_closed served through the outage"
        assert {s.status for s in shots if not s.ok} == {429}  # refused in the caller's shape, nothing else
        assert all('"error"' in s.body for s in refused)
        back = [s for s in shots if s.started > marks["up"] + RETRY_MS / 1000 + 0.5]
        assert [s.status for s in back if not s.ok] == []  # serving again once Redis answers
    assert redis_after - redis_before == 5 and degraded == 0  # the shared buckets decide again
    assert [r.status_code for r in limited] == [200, 200, 200, 429, 429]  # ... and still limit
    assert len(rows) == sum(1 for s in shots if s.ok)
    ok_after_up = [s for s in shots if s.status != 200 and s.started > marks["up"]]
    record(f"Redis outage ({policy})", f"redis-server killed for {sz.load_s / 3:.0f} s mid-load, then restarted",
           ok_rps=round(served_rps(shots), 1), lost=len(shots) - sum(1 for s in shots if s.ok),
           recovery_s=round(max((s.started for s in ok_after_up), default=marks["up"]) - marks["up"], 2),
           detail=f"{len(during)} requests during the outage, {len(refused)} refused with 429")


SLOW_CHUNK_S = 0.3  # a stream lasts long enough to look at its slot lease in Redis


def _slot_leases(url: str, cluster: str) -> int:
    import redis

    r = redis.Redis.from_url(url, socket_timeout=2)
    try:
        return int(r.zcard(f"{{my}}:slots:{cluster}"))
    finally:
        r.close()


def _ask_async(url: str, n: int) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=chat_body("demo-gpt", f"async {n}"), timeout=20,
                      headers={"authorization": f"Bearer {DEMO_KEY}", "prefer": "respond-async"})


def _leases_while_streaming(url: str, redis_url: str, cluster: str) -> tuple[int, int]:
    """(leases in Redis while a stream holds its slot, the stream's status); the stream is read to its end."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=chat_body("demo-gpt", "a b c d e", stream=True),
                      headers={"authorization": f"Bearer {DEMO_KEY}"}, timeout=30) as r:
        chunks = r.iter_text()
        next(chunks)  # the answer has begun: its slot is held until the stream ends
        leases = _slot_leases(redis_url, cluster)
        rest = "".join(chunks)
    return leases, r.status_code if "[DONE]" in rest else -1


def test_redis_outage_slots_fail_open_tasks_refuse_with_503_and_both_recover(tmp_path) -> None:
    """`max_inflight` slots leased in Redis fail open to the process's own bound (docs/queueing.md);
    the Redis task store refuses `Prefer: respond-async` and task reads with 503 + retry-after,
    never a 500 or a hang (docs/tasks.md); once Redis is back both use it again, no restart."""
    redis = RedisServer()
    redis.start()
    data = small_config(ratelimit=_limits("fallback", redis.url))
    dep = data["models"][0]["deployments"][0]
    dep.pop("warmup", None)
    dep.update(max_inflight=1, queue={"bound": 50, "max_wait_s": {"L1": 20, "L2": 20, "L3": 20}})
    data["extproc"]["tasks"] = {"store": "redis", "redis_url": redis.url, "concurrency": 1, "lease_s": 3}
    servers = [redis]
    try:
        stack = start_stack(tmp_path, data)
        for child in stack.children:
            if child.name.startswith("demo-"):
                child.argv += ["--chunk-delay", str(SLOW_CHUNK_S)]
        with stack:
            oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=20)
            up_leases = _leases_while_streaming(stack.url, redis.url, dep["cluster"])
            first = _ask_async(stack.url, 0)
            assert first.status_code == 202, first.text

            redis.stop()
            t_down = time.monotonic()
            chats = [oai.chat.completions.with_raw_response.create(
                model="demo-gpt", messages=[{"role": "user", "content": f"down {i}"}]) for i in range(6)]
            refused = [_ask_async(stack.url, i) for i in range(1, 4)]
            read = httpx.get(f"{stack.url}/v1/tasks/{first.json()['id']}", timeout=20,
                             headers={"authorization": f"Bearer {DEMO_KEY}"})
            down_s = time.monotonic() - t_down

            servers.append(RedisServer(redis.port))
            servers[-1].start()
            t_up = time.monotonic()
            back = _ask_async(stack.url, 9)  # the first call after the restart: the pool reconnects on use
            recovery = time.monotonic() - t_up
            assert back.status_code == 202, back.text
            doc = httpx.get(f"{stack.url}/v1/tasks/{back.json()['id']}?wait=20", timeout=40,
                            headers={"authorization": f"Bearer {DEMO_KEY}"}).json()
            back_leases = _leases_while_streaming(stack.url, redis.url, dep["cluster"])
    finally:
        for srv in servers:
            srv.stop()
    record("Redis outage (slots, tasks)", "redis-server killed, 6 chats, 3 async calls and a task read, restarted",
           ok_rps="n/a", lost=sum(1 for c in chats if c.http_response.status_code != 200),
           recovery_s=round(recovery, 2),
           detail=f"chats 200 on the local max_inflight bound; async calls and the read "
                  f"{sorted({r.status_code for r in refused + [read]})} with retry-after in {down_s:.1f} s")
    assert up_leases == (1, 200) and back_leases == (1, 200)  # the slot lease lives in Redis, before and after
    assert [c.http_response.status_code for c in chats] == [200] * 6  # slots fail open to the local bound
    for r in [*refused, read]:
        assert r.status_code == 503 and r.headers.get("retry-after"), (r.status_code, r.text)
        assert r.json()["error"]["message"].startswith("the task store is unavailable")
    assert doc["status"] == "succeeded", doc  # the worker survived the outage and runs new tasks
