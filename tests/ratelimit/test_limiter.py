"""The limiter over the memory store: config, all-or-nothing, reconcile, reload, headers."""

import contextlib
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.ratelimit import parse_config
from ratelimit import Limiter, RequestContext
from ratelimit import bucket as b
from ratelimit.bucket import NANO
from ratelimit.decision import format_duration

CTX = RequestContext(tenant="acme", tier="L1", cluster="gpu-a", channel="fast")


class Clock:
    def __init__(self) -> None:
        self.us = 1_000_000

    def __call__(self) -> int:
        return self.us

    def advance(self, s: float) -> None:
        self.us += round(s * 1_000_000)


def _limiter(limits, **kw):
    clock = Clock()
    return Limiter(parse_config({"limits": limits, **kw}), clock=clock), clock


async def test_demo_limited_tenant_gets_429_after_three():
    lim, clock = _limiter([{"scope": "tenant", "match": "demo-limited", "unit": "requests", "rate": 1, "burst": 3}])
    ctx = RequestContext("demo-limited", "L3", "demo-openai", "standard")
    got = [(await lim.acquire(ctx, 10)).allowed for _ in range(4)]
    assert got == [True, True, True, False]
    d = await lim.acquire(ctx, 10)
    assert d.retry_after_s == 1.0 and d.limited_by == "tenant:demo-limited:requests"
    assert ("retry-after", "1") in d.headers()
    clock.advance(1)
    assert (await lim.acquire(ctx, 10)).allowed
    # another tenant has no rule: always allowed, no headers
    other = await lim.acquire(RequestContext("demo"), 10)
    assert other.allowed and other.headers() == []


async def test_all_or_nothing_across_buckets():
    lim, _ = _limiter([
        {"scope": "tenant", "match": "*", "rate": 1, "burst": 10},
        {"scope": "cluster", "match": "gpu-a", "rate": 1, "burst": 2},
        {"scope": "global", "unit": "tokens", "rate": 100, "burst": 1000},
    ])
    for _ in range(2):
        assert (await lim.acquire(CTX, 100)).allowed
    d = await lim.acquire(CTX, 100)
    assert not d.allowed and d.reservation is None
    levels = {v.charge.key: v.level_nano // NANO for v in d.views}
    # the refusing cluster bucket charged nothing, and neither did the others
    assert levels == {"tenant:acme:requests": 8, "cluster:gpu-a:requests": 0, "global:*:tokens": 800}


async def test_exact_match_beats_wildcard_and_each_value_has_its_own_bucket():
    lim, _ = _limiter([
        {"scope": "tenant", "match": "*", "rate": 1, "burst": 1},
        {"scope": "tenant", "match": "big", "rate": 1, "burst": 5},
    ])
    assert [(await lim.acquire(RequestContext("a"))).allowed for _ in range(2)] == [True, False]
    assert (await lim.acquire(RequestContext("b"))).allowed
    assert sum([(await lim.acquire(RequestContext("big"))).allowed for _ in range(6)]) == 5


async def test_reconcile_returns_and_takes_with_debt():
    lim, clock = _limiter([{"scope": "tenant", "match": "*", "unit": "tokens", "rate": 10, "burst": 1000}])
    d = await lim.acquire(CTX, 500)
    assert d.allowed and d.reservation is not None
    await lim.reconcile(d.reservation, 200)  # over-estimate: 300 come back
    d2 = await lim.acquire(CTX, 0)
    assert d2.views[0].level_nano == 800 * NANO
    await lim.reconcile(d.reservation, 10_000)  # second call is a no-op
    d3 = await lim.acquire(CTX, 700)
    await lim.reconcile(d3.reservation, 2600)  # under-estimate by 1900: debt, floored at -burst
    d4 = await lim.acquire(CTX, 1)
    assert not d4.allowed
    assert d4.views[0].level_nano == -1000 * NANO
    assert math.isclose(d4.retry_after_s, 100.1)
    clock.advance(100.1)
    assert (await lim.acquire(CTX, 1)).allowed


async def test_reconcile_now_corrects_memory_buckets_in_place_once():
    """The accountant's path for an in-memory limiter: no task per request, the same correction."""
    lim, _ = _limiter([{"scope": "tenant", "match": "*", "unit": "tokens", "rate": 10, "burst": 1000}])
    d = await lim.acquire(CTX, 500)
    assert lim.reconcile_now(d.reservation, 200)  # over-estimate: 300 come back, now
    assert (await lim.acquire(CTX, 0)).views[0].level_nano == 800 * NANO
    assert lim.reconcile_now(d.reservation, 10_000)  # settled: a second call changes nothing
    await lim.reconcile(d.reservation, 10_000)
    assert (await lim.acquire(CTX, 0)).views[0].level_nano == 800 * NANO
    assert lim.reconcile_now(None, 5)


async def test_cost_over_burst_is_too_large_not_retryable():
    lim, _ = _limiter([{"scope": "tenant", "match": "*", "unit": "tokens", "rate": 10, "burst": 100}])
    d = await lim.acquire(CTX, 101)
    assert not d.allowed and d.too_large and d.retry_after_s == math.inf
    assert all(k != "retry-after" for k, _ in d.headers())


async def test_reload_keeps_level_and_applies_new_limits():
    rules = [{"scope": "tenant", "match": "*", "rate": 1, "burst": 10}]
    lim, _ = _limiter(rules)
    for _ in range(4):
        await lim.acquire(CTX)
    lim.reload(parse_config({"limits": [{"scope": "tenant", "match": "*", "rate": 1, "burst": 20}]}))
    d = await lim.acquire(CTX)
    assert d.views[0].level_nano == 5 * NANO and d.views[0].params.burst_nano == 20 * NANO
    lim.reload(parse_config({"limits": [{"scope": "tenant", "match": "*", "rate": 1, "burst": 3}]}))
    d = await lim.acquire(CTX)  # level is capped at the new, smaller burst
    assert d.views[0].level_nano == 2 * NANO
    with pytest.raises(ValueError, match="backend"):
        lim.reload(parse_config({"backend": "redis", "limits": []}))
    with pytest.raises(ValueError, match=re.escape("ratelimit.limits[0].rate")):
        lim.reload(parse_config({"limits": [{"scope": "tenant", "rate": -1, "burst": 3}]}))
    assert lim.config.limits[0].burst == 3  # a bad reload changes nothing


async def test_headers_pick_the_tightest_bucket_per_unit():
    lim, _ = _limiter([
        {"scope": "tenant", "match": "*", "rate": 1, "burst": 10},
        {"scope": "channel", "match": "fast", "rate": 2, "burst": 4},
        {"scope": "tier", "match": "L1", "unit": "tokens", "rate": 1000, "burst": 60000},
    ])
    h = dict((await lim.acquire(CTX, 1500)).headers())
    assert h == {  # the channel bucket (4) is tighter but shared with other tenants: not shown
        "x-ratelimit-limit-requests": "10",
        "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "60000",
        "x-ratelimit-remaining-tokens": "58500",
        "x-ratelimit-reset-tokens": "1.5s",
    }


async def test_disabled_allows_everything():
    lim, _ = _limiter([{"scope": "global", "rate": 1, "burst": 1}], enabled=False)
    assert all([(await lim.acquire(CTX)).allowed for _ in range(5)])


def test_format_duration():
    assert [format_duration(s) for s in (0, 0.02, 1, 1.5, 360, 3723)] == ["0s", "20ms", "1s", "1.5s", "6m0s", "1h2m3s"]


@pytest.mark.parametrize(
    "raw, path",
    [
        ({"backend": "etcd"}, "ratelimit.backend"),
        ({"limits": [{"scope": "user", "rate": 1, "burst": 1}]}, "ratelimit.limits[0].scope"),
        ({"limits": [{"scope": "global", "match": "x", "rate": 1, "burst": 1}]}, "ratelimit.limits[0]"),
        ({"limits": [{"scope": "tenant", "rate": 1, "burst": 1e9}]}, "ratelimit.limits[0].burst"),
        ({"redis": {"replicas": 0}}, "ratelimit.redis.replicas"),
        ({"redis": {"failure_policy": "ignore"}}, "ratelimit.redis.failure_policy"),
        ({"limits": [{"scope": "tenant", "rate": 1, "burst": 1}] * 2}, "duplicate"),
        ({"bogus": 1}, "ratelimit.bogus"),
        ({"redis": {"url": "http://x"}}, "ratelimit.redis.url"),
    ],
 ids=[
    "unknown-backend", "unknown-scope", "global-with-match", "burst-too-big", "redis-replicas-0",
    "unknown-failure-policy", "duplicate-limit", "unknown-key", "redis-url-not-redis"
])
def test_config_errors_name_the_key(raw, path):
    with pytest.raises(ValueError, match=re.escape(path)):
        parse_config(raw)


def test_bad_redis_url_from_config():
    with pytest.raises(ValueError, match=r"ratelimit\.redis\.url"):
        Limiter(parse_config({"backend": "redis", "redis": {"url": "redis://h:notaport/0"}}))


def test_config_not_a_mapping():
    with pytest.raises(ValueError, match="mapping"):
        parse_config(["x"])


@settings(max_examples=200, deadline=None)
@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(
        st.sampled_from(["backend", "redis", "limits", "scope", "rate", "burst", "match", "unit", "url", "x"]), c, max_size=4),
    max_leaves=12,
))
def test_config_parser_fuzz_only_raises_value_error(raw):
    with contextlib.suppress(ValueError):
        parse_config(raw)


_rule_st = st.fixed_dictionaries({
    "scope": st.sampled_from(["tenant", "tier", "cluster", "channel"]),
    "match": st.sampled_from(["*", "acme", "L1", "gpu-a", "fast"]),
    "unit": st.sampled_from(["requests", "tokens"]),
    "rate": st.integers(1, 50),
    "burst": st.integers(1, 400),
})


@settings(max_examples=150, deadline=None)
@given(
    st.lists(_rule_st, min_size=1, max_size=6, unique_by=lambda r: (r["scope"], r["match"], r["unit"])),
    st.lists(st.tuples(st.integers(0, 300_000), st.integers(0, 120)), min_size=1, max_size=40),
)
async def test_all_or_nothing_property(rules, steps):
    lim, clock = _limiter(rules)
    store = lim._memory
    for gap, tokens in steps:
        clock.us += gap
        charges = lim.charges(CTX, tokens)
        before = {}
        for c in charges:
            s = store.level(c.key)
            before[c.key] = b.full(c.params, clock.us) if s is None else b.settle(s, c.params, clock.us)
        d = await lim.acquire(CTX, tokens)
        for c in charges:
            after = store.level(c.key).level_nano
            expect = before[c.key].level_nano - (c.cost_nano if d.allowed else 0)
            assert after == expect
        assert d.allowed == all(before[c.key].level_nano >= c.cost_nano for c in charges)


async def test_reconcile_on_fallback_uses_the_local_share():
    # Redis on a closed port: every decision falls back to local buckets divided by 4 replicas.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lim = Limiter(parse_config({
        "backend": "redis",
        "redis": {"url": f"redis://127.0.0.1:{port}/0", "replicas": 4, "timeout_ms": 200},
        "limits": [{"scope": "tenant", "match": "*", "unit": "tokens", "rate": 1, "burst": 4000}],
    }))
    d = await lim.acquire(CTX, 600)
    assert d.allowed and d.store == "local" and d.views[0].params.burst_nano == 1000 * NANO
    await lim.reconcile(d.reservation, 100)
    d = await lim.acquire(CTX, 0)
    assert 900 * NANO <= d.views[0].level_nano <= 901 * NANO
    await lim.close()


async def test_per_tenant_rule_by_tier():
    lim, _ = _limiter([
        {"scope": "tenant", "match": "*", "rate": 1, "burst": 5},
        {"scope": "tenant", "match": "*", "tier": "L3", "rate": 1, "burst": 2},
        {"scope": "tenant", "match": "vip", "rate": 1, "burst": 9},
    ])
    async def admitted(tenant, tier):
        return sum([(await lim.acquire(RequestContext(tenant, tier))).allowed for _ in range(10)])
    assert await admitted("a", "L3") == 2
    assert await admitted("b", "L3") == 2  # each L3 tenant its own bucket
    assert await admitted("c", "L1") == 5
    assert await admitted("vip", "L3") == 9
    with pytest.raises(ValueError, match="tier applies"):
        parse_config({"limits": [{"scope": "tier", "tier": "L3", "rate": 1, "burst": 1}]})


async def test_shared_buckets_never_reach_a_tenants_headers():
    """A tenant without its own rule sees no x-ratelimit-* (the global bucket shows everyone's traffic)."""
    lim, _ = _limiter([
        {"scope": "global", "rate": 1, "burst": 2},
        {"scope": "cluster", "match": "gpu-a", "unit": "tokens", "rate": 1, "burst": 1000},
        {"scope": "tenant", "match": "other", "rate": 1, "burst": 5},
    ])
    ok = await lim.acquire(CTX, 10)
    assert ok.allowed and ok.headers() == []
    await lim.acquire(CTX, 10)
    refused = await lim.acquire(CTX, 10)
    assert not refused.allowed and [k for k, _ in refused.headers()] == ["retry-after"]
    own = await lim.acquire(RequestContext(tenant="other", tier="L1"), 1)
    assert dict(own.headers())["x-ratelimit-limit-requests"] == "5"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["tenant", "tier", "cluster", "channel", "global"]),
                          st.sampled_from(["requests", "tokens"]), st.integers(1, 50)), max_size=6,
                unique_by=lambda r: (r[0], r[1])))
async def test_headers_only_describe_caller_buckets(rules):
    lim, _ = _limiter([{"scope": s, "match": "*", "unit": u, "rate": 1, "burst": burst} for s, u, burst in rules])
    d = await lim.acquire(CTX, 1)
    own = {(u, burst) for s, u, burst in rules if s in ("tenant", "tier")}
    shown = {(k.rsplit("-", 1)[1], int(v)) for k, v in d.headers() if k.startswith("x-ratelimit-limit-")}
    assert {u for u, _ in shown} == {u for u, _ in own}
    assert shown <= own


def test_planned_charges_follow_each_requests_costs_and_context():
    # The buckets a context charges are planned once; the costs still come from each request.
    lim, _ = _limiter([{"scope": "tenant", "unit": "requests", "rate": 1, "burst": 5},
                       {"scope": "cluster", "unit": "tokens", "rate": 10, "burst": 1000},
                       {"scope": "global", "unit": "tokens", "rate": 10, "burst": 1000}])
    first = lim.charges(CTX, 100)
    again = lim.charges(CTX, 7, requests=0)
    assert [(c.key, c.cost_nano) for c in first] == [
        ("tenant:acme:requests", NANO), ("cluster:gpu-a:tokens", 100 * NANO), ("global:*:tokens", 100 * NANO)]
    assert [(c.key, c.cost_nano) for c in again] == [
        ("tenant:acme:requests", 0), ("cluster:gpu-a:tokens", 7 * NANO), ("global:*:tokens", 7 * NANO)]
    other = lim.charges(RequestContext(tenant="zeta", tier="L2", cluster="gpu-b", channel="standard"), 1)
    assert [c.key for c in other] == ["tenant:zeta:requests", "cluster:gpu-b:tokens", "global:*:tokens"]
