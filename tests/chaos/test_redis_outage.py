"""4. Redis (the shared rate-limit buckets) stopped and restarted mid-load: `fallback` keeps
serving from local buckets, `fail_closed` refuses with 429 + retry-after (docs/ratelimit.md),
and once Redis is back the shared buckets decide again and still limit."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tests.chaos.figures import record, served_rps
from tests.chaos.observe import metered_rows, metric
from tests.chaos.settings import sizes
from tests.chaos.stacks import with_pinned
from tests.chaos.traffic import chat_body, load
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
