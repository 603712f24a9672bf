"""The async limiter the extproc session calls: acquire, reconcile, reload, close."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from contracts.config.ratelimit import RateLimitConfig, RedisConfig, Unit

from . import bucket, metrics
from .backend import BucketView, MemoryBuckets, TakeResult, monotonic_us
from .bucket import NANO, BucketParams
from .decision import Decision, Reservation, Store, decide
from .host_buckets import HostBuckets
from .rules import Charge, KeyLimits, RequestContext, RuleSet

log = logging.getLogger("modelyard.ratelimit")

_ALLOW_ALL = Decision(True)
SEEN_MAX = 10_000  # buckets remembered for `modelyard ratelimit status`
REFUSALS_KEPT = 10_000


def _scaled(c: Charge, replicas: int) -> Charge:
    """The local share of a shared bucket: rate and burst divided by the replica count."""
    p = BucketParams(max(1, c.params.rate_milli // replicas), max(1, c.params.burst_nano // replicas))
    return Charge(c.key, c.scope, c.unit, p, c.cost_nano)


class Limiter:
    """Token buckets for every request; Redis-backed (shared by replicas) or in memory."""

    def __init__(self, cfg: RateLimitConfig, *, clock: Callable[[], int] = monotonic_us,
                 host_table: str | None = None) -> None:
        """`host_table`: the file of buckets this host's workers share (ratelimit/host_buckets.py);
        None: this process's own dict, exact when it is the only worker."""
        self._cfg = cfg
        self._rules = RuleSet(cfg)
        self._clock = clock
        # The store itself (memory) or the fallback (redis).
        self._memory: MemoryBuckets | HostBuckets = (
            MemoryBuckets(clock) if host_table is None else HostBuckets(host_table, clock=clock))
        self._redis = None
        if cfg.backend == "redis":
            from .redis_store import RedisBuckets

            try:
                self._redis = RedisBuckets(cfg.redis.url, cfg.redis.timeout_ms, cfg.redis.key_prefix)
            except ValueError as e:
                raise ValueError(f"ratelimit.redis.url: {e}") from None
        self._down_until = 0.0  # monotonic seconds; Redis is skipped until then after a failure
        self._down = False
        # For the live view (ratelimit/status.py): the buckets this process charged, and its
        # recent refusals as (wall time, bucket key that bound).
        self.seen: dict[str, Charge] = {}
        self.refusals: deque[tuple[float, str]] = deque(maxlen=REFUSALS_KEPT)

    @property
    def config(self) -> RateLimitConfig:
        return self._cfg

    @property
    def rules(self) -> RuleSet:
        return self._rules

    @property
    def degraded(self) -> bool:
        return self._down

    def charges(self, ctx: RequestContext, est_tokens: int, requests: int = 1, *, key: KeyLimits | None = None,
                rules: bool = True) -> list[Charge]:
        """The buckets of one request: the config rules' (unless `rules` is False) and the key's own."""
        costs: dict[Unit, int] = {"requests": requests, "tokens": max(0, est_tokens)}
        out = self._rules.charges(ctx, costs) if rules else []
        if key is not None and (key.rpm is not None or key.tpm is not None):
            out += self._rules.key_charges(key, costs)
        return out

    async def acquire(self, ctx: RequestContext, est_tokens: int = 0, *, requests: int = 1,
                      key: KeyLimits | None = None, rules: bool = True) -> Decision:
        """Admit or refuse one request against all its buckets, all or nothing: the config rules'
        for `ctx` (unless `rules` is False: Envoy charges them) and the caller's key's own."""
        if not self._cfg.enabled:
            return _ALLOW_ALL
        return await self.acquire_charges(self.charges(ctx, est_tokens, requests, key=key, rules=rules), est_tokens)

    async def acquire_charges(self, charges: Sequence[Charge], est_tokens: int = 0) -> Decision:
        if not charges:
            return _ALLOW_ALL
        result, store = await self._take(charges)
        d = decide(result.allowed, result.views, store, est_tokens)
        metrics.decisions_series(d.allowed, store).inc()
        seen = self.seen
        for c in charges:
            if c.key not in seen and len(seen) < SEEN_MAX:
                seen[c.key] = c
        if not d.allowed:
            self.refusals.append((time.time(), d.limited_by))
        return d

    def bound_rule(self, ctx: RequestContext, decision: Decision) -> str:
        """The label of the rule whose bucket refused (`scope:match:unit`); "" when admitted."""
        if decision.allowed or not decision.limited_by:
            return ""
        for v in decision.views:
            if v.charge.key == decision.limited_by:
                return self._rules.label_of(v.charge, ctx)
        return ""

    async def levels(self, charges: Sequence[Charge]) -> list[int]:
        """Each bucket's level now (nano), refilled to now but not written: from Redis when it
        is the store and answers, else from this process's memory buckets."""
        if self._redis is not None and not self._down:
            try:
                now, stored = await self._redis.read([c.key for c in charges])
                return [c.params.burst_nano if st is None else
                        bucket.settle(bucket.BucketState(*st), c.params, now).level_nano
                        for c, st in zip(charges, stored)]
            except Exception as e:  # noqa: BLE001 - a status read must not change the policy state
                log.warning("ratelimit status: Redis read failed (%s)", e)
        now = self._clock()
        out = []
        for c in charges:
            st = self._memory.level(c.key)
            out.append(c.params.burst_nano if st is None else bucket.settle(st, c.params, now).level_nano)
        return out

    async def reconcile(self, reservation: Reservation | None, actual_tokens: int) -> None:
        """Return an over-estimate to, or take an under-estimate from, the token buckets.

        Taking may push a bucket below zero (down to -burst): later requests wait out the debt.
        Calling it twice for one reservation does nothing the second time.
        """
        if self.reconcile_now(reservation, actual_tokens):
            return
        assert reservation is not None and self._redis is not None
        delta = _settle(reservation, actual_tokens)
        if delta == 0:
            return
        try:
            await self._redis.adjust([(c, delta * NANO) for c in reservation.token_charges])
        except Exception as e:  # noqa: BLE001 - a lost correction must never fail a response
            self._redis_failed(e)

    def reconcile_now(self, reservation: Reservation | None, actual_tokens: int) -> bool:
        """`reconcile` done in place where no Redis call is needed (memory or local buckets, or
        nothing to correct): True; False, nothing changed, where Redis holds the buckets (then
        `reconcile` does it). No task per request for an in-memory limiter."""
        if reservation is None or reservation.settled or not reservation.token_charges:
            return True
        if reservation.store == "redis" and self._redis is not None:
            return False
        delta = _settle(reservation, actual_tokens)
        if delta == 0:
            return True
        # "memory" or "local": the reservation holds the (already scaled) charges it was made with
        self._memory.adjust_now([(c, delta * NANO) for c in reservation.token_charges])
        return True

    def reload(self, cfg: RateLimitConfig) -> None:
        """Swap the limits without a restart; existing buckets keep their level (capped at burst)."""
        if cfg.backend != self._cfg.backend or (cfg.backend == "redis" and cfg.redis != self._cfg.redis):
            raise ValueError("ratelimit.backend: changing the backend or redis settings needs a restart")
        self._rules = RuleSet(cfg)
        self._cfg = cfg

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.close()
            self._redis = None
        await self._memory.close()

    # -- store selection and the Redis failure policy --

    async def _take(self, charges: Sequence[Charge]) -> tuple[TakeResult, Store]:
        if self._redis is None:
            return self._memory.take_now(charges), "memory"
        if self._down and time.monotonic() < self._down_until:
            return self._degraded(charges)
        try:
            result = await self._redis.take(charges)
        except Exception as e:  # noqa: BLE001 - any Redis trouble goes to the policy, never a crash
            self._redis_failed(e)
            return self._degraded(charges)
        if self._down:
            self._down = False
            metrics.DEGRADED.set(0)
            log.warning("ratelimit: Redis is back; shared buckets in force again")
        if result.allowed and self._cfg.redis.failure_policy == "fallback":
            # The local share follows what this replica took: a failover must not hand out a fresh burst.
            self._memory.take_now([_scaled(c, self._cfg.redis.replicas) for c in charges])
        return result, "redis"

    def _redis_failed(self, e: BaseException) -> None:
        rc: RedisConfig = self._cfg.redis
        metrics.BACKEND_ERRORS.labels(rc.failure_policy).inc()
        self._down_until = time.monotonic() + rc.retry_interval_ms / 1000
        if not self._down:
            self._down = True
            metrics.DEGRADED.set(1)
        log.warning(
            "ratelimit: Redis call failed (%s: %s); policy %s until it answers again",
            type(e).__name__, e, rc.failure_policy,
        )

    def _degraded(self, charges: Sequence[Charge]) -> tuple[TakeResult, Store]:
        rc = self._cfg.redis
        if rc.failure_policy == "fallback":
            return self._memory.take_now([_scaled(c, rc.replicas) for c in charges]), "local"
        wait = max(1, rc.retry_interval_ms) * 1000
        return TakeResult(False, tuple(BucketView(c, 0, wait) for c in charges)), "fail_closed"


__all__ = ["Decision", "KeyLimits", "Limiter", "RequestContext", "Reservation"]


def _settle(reservation: Reservation, actual_tokens: int) -> int:
    """Mark `reservation` settled; the tokens to hand back (negative: to take), counted."""
    reservation.settled = True
    delta = reservation.est_tokens - max(0, actual_tokens)
    if delta:
        metrics.RECONCILED_TOKENS.labels("returned" if delta > 0 else "taken").inc(abs(delta))
    return delta
