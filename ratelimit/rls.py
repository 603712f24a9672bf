"""Envoy's rate limit service (envoy.service.ratelimit.v3) over the same buckets as the limiter.

Descriptor mapping: each descriptor's entries name a context field (`tenant`, `tier`, `cluster`,
`channel`); `generic_key: global` selects the global bucket; an optional `unit` entry
(`requests` | `tokens`, default requests) picks the unit. A descriptor charges each bucket it
selects `hits_addend` units: the descriptor's own when set (0 then means check only), else the
request's, where 0 (the proto3 default) means 1. All buckets of one request are decided
together: all or nothing.
Entries with other keys are ignored; a descriptor that selects no bucket is OK with no limit.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf.duration_pb2 import Duration

from contracts.config.ratelimit import MAX_BURST, UNITS, Scope, Unit
from contracts.grpc_services import ServiceTable

from .backend import BucketView
from .bucket import NANO, US, reset_us
from .decision import Decision
from .limiter import Limiter
from .rules import Charge, RequestContext

# Told of every decision: the context the descriptors named, the requests and tokens asked for.
DecisionHook = Callable[[RequestContext, int, int, Decision], None]

# Descriptor entry keys that name a context field, and the scope each selects.
_CTX_SCOPES: dict[str, Scope] = {"tenant": "tenant", "tier": "tier", "cluster": "cluster", "channel": "channel"}
_RL = rls_pb2.RateLimitResponse
_OK = _RL.OK
_OVER = _RL.OVER_LIMIT


def descriptor_charges(limiter: Limiter, descriptor: ratelimit_pb2.RateLimitDescriptor, hits: int) -> list[Charge]:
    """The buckets one RLS descriptor selects (see the module doc for the mapping)."""
    unit: Unit = "requests"
    wanted: list[tuple[Scope, str]] = []
    for e in descriptor.entries:
        scope = _CTX_SCOPES.get(e.key)
        if scope is not None:
            wanted.append((scope, e.value))
        elif e.key == "generic_key" and e.value == "global":
            wanted.append(("global", "*"))
        elif e.key == "unit" and e.value in UNITS:
            unit = e.value
    tier = next((v for k, v in wanted if k == "tier"), None)  # picks per-tier tenant rules
    out = []
    for scope, value in wanted:
        c = limiter.rules.charge(scope, value, unit, hits, tier)
        if c is not None:
            out.append(c)
    return out


def _duration(us: int) -> Duration:
    d = Duration()
    d.seconds, rem = divmod(max(0, us), US)
    d.nanos = rem * 1000
    return d


def _rate_limit(v: BucketView) -> rls_pb2.RateLimitResponse.RateLimit:
    # RLS limits are whole requests per unit of time: pick the smallest unit that keeps precision.
    per_s = v.params.rate_milli / 1000
    for unit, secs in ((_RL.RateLimit.SECOND, 1), (_RL.RateLimit.MINUTE, 60), (_RL.RateLimit.HOUR, 3600)):
        n = per_s * secs
        if n >= 1 and abs(n - round(n)) < 1e-9 or unit == _RL.RateLimit.HOUR:
            return _RL.RateLimit(name=v.charge.key, requests_per_unit=max(1, round(n)), unit=unit)
    raise AssertionError("unreachable")


def build_response(groups: list[list[Charge]], decision: Decision) -> rls_pb2.RateLimitResponse:
    """Overall code plus one status per descriptor (pure)."""
    by_key = {v.charge.key: v for v in decision.views}
    resp = rls_pb2.RateLimitResponse(overall_code=_OK if decision.allowed else _OVER)
    for charges in groups:
        st = resp.statuses.add()
        views = [by_key[c.key] for c in charges if c.key in by_key]
        if not views:
            st.code = _OK
            continue
        tight = min(views, key=lambda v: (v.level_nano, v.params.burst_nano))
        refused = not decision.allowed and any(v.wait_us != 0 for v in views)
        st.code = _OVER if refused else _OK
        st.current_limit.CopyFrom(_rate_limit(tight))
        st.limit_remaining = max(0, tight.level_nano) // NANO
        wait = max(v.wait_us for v in views)
        st.duration_until_reset.CopyFrom(_duration(wait if refused and wait > 0 else reset_us(tight.level_nano, tight.params)))
    if not decision.allowed:
        for k, v in decision.headers():
            resp.response_headers_to_add.add(key=k, value=v)
    return resp


def _context(request: rls_pb2.RateLimitRequest) -> RequestContext:
    """The context fields the descriptors name (the first value of each wins)."""
    seen: dict[str, str] = {}
    for d in request.descriptors:
        for e in d.entries:
            if e.key in _CTX_SCOPES and e.key not in seen:
                seen[e.key] = e.value
    return RequestContext(seen.get("tenant"), seen.get("tier"), seen.get("cluster"), seen.get("channel"))


class RateLimitService(rls_pb2_grpc.RateLimitServiceServicer):
    def __init__(self, limiter: Limiter, on_decision: DecisionHook | None = None) -> None:
        self._limiter = limiter
        self._on_decision = on_decision

    async def ShouldRateLimit(  # noqa: N802
        self, request: rls_pb2.RateLimitRequest, context: grpc.aio.ServicerContext
    ) -> rls_pb2.RateLimitResponse:
        groups: list[list[Charge]] = []
        flat: dict[str, Charge] = {}
        for d in request.descriptors:
            hits = d.hits_addend.value if d.HasField("hits_addend") else (request.hits_addend or 1)
            # more than any burst is refused anyway; the cap keeps Redis arithmetic in range
            cs = descriptor_charges(self._limiter, d, min(hits, 2 * MAX_BURST))
            groups.append(cs)
            for c in cs:
                # one bucket named by two descriptors is charged once, with the larger cost
                prev = flat.get(c.key)
                if prev is None or c.cost_nano > prev.cost_nano:
                    flat[c.key] = c
        if not self._limiter.config.enabled:
            flat.clear()
        decision = await self._limiter.acquire_charges(list(flat.values()))
        if self._on_decision is not None and flat:
            asked = {u: max((c.cost_nano for c in flat.values() if c.unit == u), default=0) // NANO for u in UNITS}
            self._on_decision(_context(request), asked["requests"], asked["tokens"], decision)
        return build_response(groups, decision)


def add_to_server(server: ServiceTable, limiter: Limiter,
                  on_decision: DecisionHook | None = None) -> RateLimitService:
    """Register the RLS servicer on a grpc.aio server (the extproc server or a separate one);
    `on_decision` is told of every decision (the extproc records them in the metering store)."""
    svc = RateLimitService(limiter, on_decision)
    rls_pb2_grpc.add_RateLimitServiceServicer_to_server(svc, server)
    return svc


__all__ = ["RateLimitService", "add_to_server", "build_response", "descriptor_charges"]
