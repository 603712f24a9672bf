"""Rate limits through a real Envoy: 429s in the caller's shape, Redis shared by two replicas,
Redis failure policy, and Envoy's own ratelimit filter asking our RLS."""

from __future__ import annotations

import math
import time
from pathlib import Path

import httpx
import pytest

from controlplane.environments import EnvironmentConfig
from tests.conftest import DEMO_KEY
from tests.ratelimit.redis_server import RedisServer
from tests.stack_config import add_extproc_replica, small_config, start_stack

pytestmark = pytest.mark.e2e
LIMITED = "sk-modelyard-demo-limited"


def _chat(url: str, key: str, model: str = "demo-gpt") -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "count me"}]}, timeout=10)


def _until_limited(send, tries: int = 10) -> tuple[list, object]:
    seen = []
    for _ in range(tries):
        r = send()
        seen.append(r)
        if getattr(r, "status_code", None) == 429:
            return seen, r
    return seen, None


def test_limited_key_gets_openai_429_with_headers(demo_stack) -> None:
    seen, limited = _until_limited(lambda: _chat(demo_stack.url, LIMITED))
    assert limited is not None, [r.status_code for r in seen]
    assert limited.json()["error"]["type"] and "rate limit" in limited.json()["error"]["message"]
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.headers["x-ratelimit-limit-requests"] == "3"
    assert limited.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-reset-requests" in limited.headers
    assert "x-modelyard-task-id" in limited.headers


def test_limited_key_gets_anthropic_429(demo_stack) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=demo_stack.url, api_key=LIMITED, max_retries=0)

    def send():
        try:
            return client.messages.with_raw_response.create(
                model="demo-gpt", max_tokens=50, messages=[{"role": "user", "content": "hi"}])
        except anthropic.RateLimitError as e:
            return e.response

    _, limited = _until_limited(send)
    assert limited is not None
    body = limited.json()
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert "retry-after" in limited.headers


def test_admitted_requests_carry_only_their_own_buckets(demo_stack) -> None:
    # demo-l3 has its tier's per-tenant token bucket: shown. Its requests pass only the global
    # bucket, shared by every tenant: not shown.
    r = _chat(demo_stack.url, "sk-modelyard-demo-l3")
    assert r.status_code == 200
    assert int(r.headers["x-ratelimit-remaining-tokens"]) > 0
    assert "x-ratelimit-remaining-requests" not in r.headers
    # demo (L1) has no rule of its own: no x-ratelimit-* at all, though the global bucket charged it.
    r = _chat(demo_stack.url, DEMO_KEY)
    assert r.status_code == 200
    assert not [h for h in r.headers if h.startswith("x-ratelimit-")]


def _limits(burst: int, rate: float, policy: str = "fallback", url: str = "", replicas: int = 2) -> dict:
    return {"backend": "redis", "redis": {"url": url, "replicas": replicas, "failure_policy": policy,
                                          "timeout_ms": 200, "retry_interval_ms": 200},
            "limits": [{"scope": "tenant", "match": "demo", "unit": "requests", "rate": rate, "burst": burst}]}


@pytest.fixture
def redis_server():
    srv = RedisServer()
    srv.start()
    yield srv
    srv.stop()


def _served(metrics_address: str) -> float:
    """Requests one extproc replica decided (admitted or limited), from its own /metrics."""
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(ln.split()[-1]) for ln in text.splitlines()
               if ln.startswith("modelyard_ratelimit_decisions_total{"))


def test_two_replicas_share_one_redis_bucket(tmp_path: Path, redis_server) -> None:
    rate, burst = 2.0, 5
    data = small_config(ratelimit=_limits(burst, rate, url=redis_server.url))
    stack = start_stack(tmp_path, data, EnvironmentConfig(name="t", admin=None, concurrency=1))
    second, second_metrics = add_extproc_replica(stack, data, tmp_path)
    stack.env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                                  extproc_endpoints=[data["extproc"]["address"], second])
    with stack:
        start = time.monotonic()
        statuses = []
        while time.monotonic() - start < 3.0:
            statuses.append(_chat(stack.url, DEMO_KEY).status_code)
        elapsed = time.monotonic() - start
        served = [_served(m) for m in (data["extproc"]["metrics_address"], second_metrics)]
    assert all(n > 0 for n in served), served  # Envoy spread the streams over both replicas
    admitted = statuses.count(200)
    assert statuses.count(429) > 0
    assert admitted <= math.floor(rate * elapsed + burst) + 1, (admitted, elapsed)
    assert admitted >= burst


def test_redis_down_falls_back_to_local_buckets(tmp_path: Path, redis_server) -> None:
    data = small_config(ratelimit=_limits(1000, 1000, policy="fallback", url=redis_server.url, replicas=1))
    with start_stack(tmp_path, data) as stack:
        assert _chat(stack.url, DEMO_KEY).status_code == 200
        redis_server.stop()
        statuses = [_chat(stack.url, DEMO_KEY).status_code for _ in range(5)]
        metrics = httpx.get(f"http://{data['extproc']['metrics_address']}/metrics").text
    assert statuses == [200] * 5
    errors = [ln for ln in metrics.splitlines() if ln.startswith("modelyard_ratelimit_backend_errors_total")]
    assert errors and float(errors[0].split()[-1]) >= 1


def test_redis_down_fail_closed_refuses(tmp_path: Path, redis_server) -> None:
    data = small_config(ratelimit=_limits(1000, 1000, policy="fail_closed", url=redis_server.url, replicas=1))
    with start_stack(tmp_path, data) as stack:
        assert _chat(stack.url, DEMO_KEY).status_code == 200
        redis_server.stop()
        r = _chat(stack.url, DEMO_KEY)
    assert r.status_code == 429 and "retry-after" in r.headers


def test_envoy_ratelimit_filter_uses_our_rls(tmp_path: Path) -> None:
    data = small_config(ratelimit={"enforce": "envoy", "limits": [
        {"scope": "tenant", "match": "demo", "unit": "requests", "rate": 0.01, "burst": 2}]})
    env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                            rate_limit_service={"domain": "modelyard", "timeout_s": 1.0})
    with start_stack(tmp_path, data, env) as stack:
        statuses = [_chat(stack.url, DEMO_KEY).status_code for _ in range(4)]
        other = _chat(stack.url, "sk-modelyard-demo-l2").status_code
    assert statuses == [200, 200, 429, 429]
    assert other == 200  # another tenant's bucket is untouched


def test_sighup_reloads_limits(tmp_path: Path) -> None:
    import signal

    import yaml

    data = small_config(ratelimit={"limits": [
        {"scope": "tenant", "match": "demo", "unit": "requests", "rate": 0.01, "burst": 1}]})
    with start_stack(tmp_path, data) as stack:
        assert [_chat(stack.url, DEMO_KEY).status_code for _ in range(2)] == [200, 429]
        data["ratelimit"]["limits"][0].update(rate=1000, burst=1000)
        stack.config_path.write_text(yaml.safe_dump(data))
        stack.child("extproc").proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while _chat(stack.url, DEMO_KEY).status_code != 200:
            assert time.monotonic() < deadline, "limits not reloaded"
            time.sleep(0.1)


def test_token_estimate_is_reconciled_with_usage(tmp_path: Path) -> None:
    """Charged on arrival: prompt estimate + max_tokens; corrected to the upstream's usage after."""
    data = small_config(ratelimit={"limits": [
        {"scope": "tenant", "match": "demo", "unit": "tokens", "rate": 0.001, "burst": 100000}]})
    with start_stack(tmp_path, data) as stack:
        def send() -> int:
            r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                           json={"model": "demo-gpt", "max_tokens": 1000,
                                 "messages": [{"role": "user", "content": "tokens please"}]}, timeout=10)
            assert r.status_code == 200
            return int(r.headers["x-ratelimit-remaining-tokens"])

        first = send()
        time.sleep(0.3)  # the reconciliation runs when the answer has ended
        second = send()
    assert first <= 100000 - 1000  # the estimate covered max_tokens
    # Without reconciliation the second would be ~1000 lower than the first; with it, the first
    # request's unused estimate came back, so the second charge leaves about as much as before.
    assert second > first - 100, (first, second)
