"""Envoy's RateLimitService over grpc.aio, sharing buckets with the limiter."""

import grpc
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.wrappers_pb2 import UInt64Value

from contracts.config.ratelimit import parse_config
from ratelimit import Limiter, RequestContext
from ratelimit.rls import add_to_server

OK = rls_pb2.RateLimitResponse.OK
OVER = rls_pb2.RateLimitResponse.OVER_LIMIT


def _desc(hits=None, **entries):
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries.items()]
    )
    if hits is not None:
        d.hits_addend.CopyFrom(UInt64Value(value=hits))
    return d


@pytest.fixture
async def rls():
    clock = [1_000_000]
    lim = Limiter(parse_config(
        {"limits": [
            {"scope": "tenant", "match": "demo-limited", "rate": 1, "burst": 3},
            {"scope": "global", "unit": "tokens", "rate": 100, "burst": 1000},
            {"scope": "cluster", "match": "*", "rate": 0.5, "burst": 100},
        ]}),
        clock=lambda: clock[0],
    )
    server = grpc.aio.server()
    add_to_server(server, lim)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    yield rls_pb2_grpc.RateLimitServiceStub(channel), lim, clock
    await channel.close()
    await server.stop(None)
    await lim.close()


async def test_hits_addend_and_over_limit(rls):
    stub, lim, clock = rls
    req = rls_pb2.RateLimitRequest(domain="modelyard", descriptors=[_desc(tenant="demo-limited")], hits_addend=2)
    r = await stub.ShouldRateLimit(req)
    assert r.overall_code == OK and r.statuses[0].code == OK
    assert r.statuses[0].limit_remaining == 1
    assert r.statuses[0].current_limit.requests_per_unit == 1
    assert r.statuses[0].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.SECOND
    r = await stub.ShouldRateLimit(req)
    assert r.overall_code == OVER and r.statuses[0].code == OVER
    assert r.statuses[0].duration_until_reset.seconds == 1
    assert any(h.key == "retry-after" for h in r.response_headers_to_add)
    # the same bucket the extproc path uses
    d = await lim.acquire(RequestContext(tenant="demo-limited"))
    assert d.allowed and d.views[0].level_nano == 0
    clock[0] += 3_000_000
    r = await stub.ShouldRateLimit(rls_pb2.RateLimitRequest(descriptors=[_desc(tenant="demo-limited")]))
    assert r.overall_code == OK and r.statuses[0].limit_remaining == 2  # hits_addend 0 means 1


async def test_descriptors_are_all_or_nothing_with_per_descriptor_status(rls):
    stub, lim, _ = rls
    req = rls_pb2.RateLimitRequest(descriptors=[
        _desc(hits=900, generic_key="global", unit="tokens"),
        _desc(cluster="gpu-a"),
        _desc(unknown="x"),
    ])
    r = await stub.ShouldRateLimit(req)
    assert r.overall_code == OK
    assert [s.code for s in r.statuses] == [OK, OK, OK]
    assert r.statuses[1].current_limit.unit == rls_pb2.RateLimitResponse.RateLimit.MINUTE
    assert r.statuses[1].current_limit.requests_per_unit == 30
    assert not r.statuses[2].HasField("current_limit")
    r = await stub.ShouldRateLimit(req)
    assert r.overall_code == OVER
    assert [s.code for s in r.statuses] == [OVER, OK, OK]
    assert r.statuses[0].limit_remaining == 100
    assert r.statuses[0].duration_until_reset.seconds == 8  # 800 tokens short at 100/s
    # the cluster bucket was not charged by the refused request
    assert r.statuses[1].limit_remaining == 99


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ratelimit.rls import RateLimitService  # noqa: E402

_entry = st.tuples(
    st.sampled_from(["tenant", "tier", "cluster", "channel", "generic_key", "unit", "other", ""]),
    st.sampled_from(["demo-limited", "global", "tokens", "requests", "*", "", "x:y{z}"]) | st.text(max_size=6),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(st.tuples(st.lists(_entry, max_size=4), st.none() | st.integers(0, 2**64 - 1)), max_size=4),
    st.integers(0, 2**32 - 1),
)
async def test_fuzz_descriptors_never_fail(descs, hits):
    lim = Limiter(parse_config({"limits": [
        {"scope": "tenant", "match": "*", "rate": 1, "burst": 3},
        {"scope": "global", "unit": "tokens", "rate": 100, "burst": 1000},
    ]}))
    svc = RateLimitService(lim)
    req = rls_pb2.RateLimitRequest(hits_addend=hits)
    for entries, h in descs:
        d = req.descriptors.add()
        for k, v in entries:
            d.entries.add(key=k, value=v)
        if h is not None:
            d.hits_addend.value = h
    r = await svc.ShouldRateLimit(req, None)
    assert len(r.statuses) == len(descs)
    assert r.overall_code in (OK, OVER)
