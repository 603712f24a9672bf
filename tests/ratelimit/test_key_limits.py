"""A store key's own limits (`--rpm`, `--tpm`): a bucket per key id beside the config rules', charged
in the same all-or-nothing decision, on the same store (memory, the host table, Redis)."""

from __future__ import annotations

from pathlib import Path

from contracts.config.keys import Budget
from contracts.config.ratelimit import parse_config
from contracts.keys import Caller
from ratelimit import Limiter, RequestContext
from ratelimit.bucket import NANO

CTX = RequestContext(tenant="demo", tier="L3", cluster="demo-openai", channel="standard")


class Clock:
    def __init__(self) -> None:
        self.us = 1_000_000

    def __call__(self) -> int:
        return self.us

    def advance(self, s: float) -> None:
        self.us += round(s * 1_000_000)


def _limiter(limits: list[dict[str, object]] | None = None, **kw: object) -> tuple[Limiter, Clock]:
    clock = Clock()
    return Limiter(parse_config({"limits": limits or [], **kw}), clock=clock), clock


async def test_a_key_with_rpm_gets_its_own_bucket_and_refusal() -> None:
    lim, clock = _limiter()  # no config rule at all: the key's limit stands alone
    key = Caller("demo", "key_a", rpm=3)
    got = [(await lim.acquire(CTX, 50, key=key)).allowed for _ in range(4)]
    assert got == [True, True, True, False]
    d = await lim.acquire(CTX, 50, key=key)
    assert not d.allowed and not d.too_large and d.reservation is None
    assert d.limited_by == "key:key_a:requests" and lim.bound_rule(CTX, d) == "key:key_a:requests"
    # 3 a minute refill one request every 20 s; the refusal says so the way a tenant bucket does.
    assert d.retry_after_s == 20.0
    headers = dict(d.headers())
    assert headers["retry-after"] == "20" and headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    # Another key of the same tenant has its own bucket; the tenant's config key has none.
    assert (await lim.acquire(CTX, 50, key=Caller("demo", "key_b", rpm=3))).allowed
    assert (await lim.acquire(CTX, 50, key=Caller("demo", None))).allowed
    clock.advance(20)
    assert (await lim.acquire(CTX, 50, key=key)).allowed
    assert not (await lim.acquire(CTX, 50, key=key)).allowed


async def test_no_bucket_for_a_key_without_limits() -> None:
    lim, _ = _limiter([{"scope": "tenant", "match": "*", "rate": 100, "burst": 100}])
    plain = Caller("demo", "key_plain", budget=Budget(usd=1, period="day"))
    assert [c.key for c in lim.charges(CTX, 10, key=plain)] == ["tenant:demo:requests"]
    assert [c.key for c in lim.charges(CTX, 10, key=None)] == ["tenant:demo:requests"]
    for _ in range(5):
        assert (await lim.acquire(CTX, 10, key=plain)).allowed
    assert set(lim.seen) == {"tenant:demo:requests"}
    limited = Caller("demo", "key_l", rpm=5, tpm=1000)
    charges = {c.key: c for c in lim.charges(CTX, 120, key=limited)}
    assert set(charges) == {"tenant:demo:requests", "key:key_l:requests", "key:key_l:tokens"}
    tok = charges["key:key_l:tokens"]
    assert tok.scope == "key" and tok.cost_nano == 120 * NANO
    assert tok.params.burst_nano == 1000 * NANO and tok.params.rate_milli == round(1000 / 60 * 1000)


async def test_key_and_tenant_buckets_are_all_or_nothing() -> None:
    lim, _ = _limiter([{"scope": "tenant", "match": "demo", "rate": 1, "burst": 10}])
    key = Caller("demo", "key_a", rpm=2)
    assert [(await lim.acquire(CTX, key=key)).allowed for _ in range(3)] == [True, True, False]
    # The key's refusal took nothing from its tenant: 8 of the tenant's 10 are left for its other keys.
    other = Caller("demo", "key_b")
    assert [(await lim.acquire(CTX, key=other)).allowed for _ in range(9)] == [True] * 8 + [False]
    d = await lim.acquire(CTX, key=key)
    assert not d.allowed and d.limited_by in ("key:key_a:requests", "tenant:demo:requests")


async def test_tpm_is_charged_by_the_estimate_and_reconciled_with_usage() -> None:
    lim, _ = _limiter()
    key = Caller("demo", "key_t", tpm=1000)
    d = await lim.acquire(CTX, 600, key=key)
    assert d.allowed and d.reservation is not None
    assert [c.key for c in d.reservation.token_charges] == ["key:key_t:tokens"]
    refused = await lim.acquire(CTX, 600, key=key)
    assert not refused.allowed and refused.limited_by == "key:key_t:tokens"
    await lim.reconcile(d.reservation, 100)  # it used 100: 500 go back
    assert (await lim.acquire(CTX, 600, key=key)).allowed
    too_big = await lim.acquire(CTX, 5000, key=key)
    assert too_big.too_large and "retry-after" not in dict(too_big.headers())


async def test_envoy_enforced_rules_leave_only_the_key_to_the_extproc() -> None:
    lim, _ = _limiter([{"scope": "tenant", "match": "*", "rate": 1, "burst": 1}], enforce="envoy")
    key = Caller("demo", "key_e", rpm=2)
    assert [c.key for c in lim.charges(CTX, 10, key=key, rules=False)] == ["key:key_e:requests"]
    assert [(await lim.acquire(CTX, key=key, rules=False)).allowed for _ in range(3)] == [True, True, False]


async def test_disabled_limiter_ignores_key_limits_too() -> None:
    lim, _ = _limiter(enabled=False)
    key = Caller("demo", "key_a", rpm=1)
    assert all([(await lim.acquire(CTX, key=key)).allowed for _ in range(3)])


async def test_workers_of_a_host_share_a_keys_bucket(tmp_path: Path) -> None:
    cfg = parse_config({})
    a = Limiter(cfg, host_table=str(tmp_path / "b"), clock=lambda: 0)
    b = Limiter(cfg, host_table=str(tmp_path / "b"), clock=lambda: 0)
    key = Caller("demo", "key_w", rpm=3)
    got = [(await lim.acquire(CTX, key=key)).allowed for lim in (a, b, a, b)]
    assert got == [True, True, True, False]
    assert (await a.acquire(CTX, key=Caller("demo", "key_x", rpm=3))).allowed
    await a.close()
    await b.close()


async def test_replicas_on_redis_share_a_keys_bucket(redis_server) -> None:  # type: ignore[no-untyped-def]
    cfg = parse_config({"backend": "redis", "redis": {"url": redis_server.url, "timeout_ms": 500}})
    a, b = Limiter(cfg), Limiter(cfg)
    key = Caller("demo", "key_r", rpm=3)
    decisions = [await lim.acquire(CTX, key=key) for lim in (a, b, a, b)]
    assert [d.allowed for d in decisions] == [True, True, True, False]
    assert {d.store for d in decisions} == {"redis"} and decisions[-1].limited_by == "key:key_r:requests"
    await a.close()
    await b.close()
