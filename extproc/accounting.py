"""After the answer: scheduler feedback, metrics, the metering row and the token reconciliation."""

from __future__ import annotations

import asyncio
import logging
import time

from adapters.internal import NO_CACHE, Usage
from budgets.pricing import charge, search_cost
from contracts.config import Cost
from extproc.admission.budget_guard import BudgetGuard
from extproc.admission.choice import Choice
from extproc.context import CallOutcome, RequestContext
from extproc.routing import Scheduler
from extproc.routing.breaker import GroupBreaker
from extproc.telemetry.demand import DEMAND
from extproc.telemetry.metering import MeteringStore
from extproc.telemetry.metrics import (
    ARM_CALLS,
    ARM_COST,
    ARM_REWARD,
    BREAKER_TRIPS,
    MEDIA_UNITS,
    WEB_SEARCHES,
    cache_series,
    channel_series,
    cost_series,
    model_series,
    requests_series,
    tenant_token_series,
)
from ratelimit import Limiter

log = logging.getLogger("modelyard.accounting")


def _tripped(breakers: list[GroupBreaker]) -> None:
    for b in breakers:
        BREAKER_TRIPS.labels(b.group, "error_rate").inc()
        log.warning("group breaker %s opened: error rate over %.0f%% in %gs; routing around it for %gs",
                    b.group, b.settings.error_rate * 100, b.settings.window_s, b.settings.open_s)


def media_cost(price: Cost, unit: str, amount: float) -> float:
    per = {"image": price.per_image, "second": price.per_audio_second,
           "character": price.per_1k_characters / 1000}.get(unit, 0.0)
    return per * amount


class Accountant:
    def __init__(self, scheduler: Scheduler, limiter: Limiter | None = None,
                 metering: MeteringStore | None = None, budgets: BudgetGuard | None = None) -> None:
        self.scheduler = scheduler
        self.limiter = limiter
        self.metering = metering
        self.budgets = budgets
        self._background: set[asyncio.Task[None]] = set()

    def record_outcome(self, ctx: RequestContext, choice: Choice, *, status: int, upstream_ok: bool | None,
                       latency_s: float, ttft_s: float | None, usage: Usage | None,
                       media: tuple[str, float] | None = None) -> None:
        """`status` is what the caller got; `upstream_ok` what the upstream did: False only for its own
        failure (5xx, a reply we cannot read, a stream it cut), None when it never answered for
        itself (the client left, or the gateway failed the request): no feedback either way."""
        choice.release_slot()  # first: the next waiter goes while we meter this one
        DEMAND.touch(choice.deployment.cluster)
        model = choice.model
        if upstream_ok is not None:  # a client that leaves or our own error must not cool a deployment down
            _tripped(self.scheduler.record(choice.deployment.cluster, latency_s, upstream_ok, ttft_s,
                                           now=time.monotonic(), tenant=ctx.tenant_name))
        latency, ttft, tokens_in, tokens_out = model_series(model.name, choice.deployment.cluster)
        requests_series(model.name, choice.deployment.cluster, status).inc()
        latency.observe(latency_s)
        tier = ctx.tenant.tier if ctx.tenant else "-"
        channel_series(choice.channel, tier).inc()
        if ttft_s is not None:
            ttft.observe(ttft_s)
        tin = tout = 0
        cache = NO_CACHE
        if usage is not None:
            tin, tout = usage.input_tokens or 0, usage.output_tokens or 0
            tokens_in.inc(tin)
            tokens_out.inc(tout)
            tenant_in, tenant_out = tenant_token_series(ctx.tenant_name)
            tenant_in.inc(tin)
            tenant_out.inc(tout)
            cache = usage.cache
        ctx.outcome = CallOutcome(model.name, choice.deployment.cluster, status, tin, tout)
        price = choice.deployment.cost or model.cost  # a deployment's own price (spot) bills as it routed
        cost, saved = charge(price, tin, tout, cache.read, cache.write, cache.write_1h)
        if usage is not None and usage.web_searches:  # a search tool's calls: billed apart from tokens
            cost += search_cost(price, usage.web_searches)
            WEB_SEARCHES.labels(model.name, choice.deployment.cluster).inc(usage.web_searches)
        if media is not None:  # images, audio seconds, speech characters: the provider's own units
            cost += media_cost(price, *media)
            MEDIA_UNITS.labels(model.name, media[0]).inc(media[1])
        if ctx.batch_line and price.batch_discount:  # a batch line, where the provider bills batches lower
            cost *= 1.0 - price.batch_discount
        if cache:
            cache_read, cache_write, cache_saved = cache_series(model.name, choice.deployment.cluster, ctx.tenant_name)
            cache_read.inc(cache.read)
            cache_write.inc(cache.write)
            if saved > 0:  # a counter goes up only: the row keeps a write that cost more than it saved
                cache_saved.inc(saved)
        if cost:
            by_model, by_deployment = cost_series(model.name, ctx.tenant_name, choice.deployment.cluster, choice.channel)
            by_model.inc(cost)
            by_deployment.inc(cost)
            if self.budgets is not None:  # a stream that ran past its budget still counts in full
                self.budgets.record(ctx, cost)
        if choice.propensity is not None or choice.strategy in self.scheduler.settings.ab.weights_b:  # an experiment
            self._arm_outcome(ctx, choice, upstream_ok, latency_s, cost)
        if self.metering is not None:
            # A MeterRecord's values as a plain tuple: the row the writer inserts, nothing built per field.
            self.metering.record((
                time.time(), ctx.task_id, ctx.tenant_name, tier, model.name, choice.deployment.cluster,
                choice.channel, status, latency_s * 1000, ttft_s * 1000 if ttft_s is not None else None, tin, tout,
                cost, choice.strategy, choice.arm, ctx.caller.key_id if ctx.caller is not None else None,
                cache.read, cache.write, cache.write_1h, saved, 0, choice.propensity))
        if choice.reservation is not None and self.limiter is not None:
            # Hand back (or take) the difference between the estimate and the reported usage.
            self._reconcile(choice, tin + tout)

    def _arm_outcome(self, ctx: RequestContext, choice: Choice, upstream_ok: bool | None, latency_s: float,
                     cost: float) -> None:
        """An A/B or bandit arm's call: its metrics and, for the learning strategy's, the reward it learns."""
        # The arm answered itself: a failover to a peer (Envoy's retry) is the arm's failure; a spill is not.
        ok = bool(upstream_ok) and (choice.deployment.cluster == choice.arm or bool(choice.spilled_from))
        ARM_CALLS.labels(choice.strategy, choice.arm, "ok" if ok or upstream_ok is None else "error").inc()
        if cost:
            ARM_COST.labels(choice.strategy, choice.arm).inc(cost)
        # A spill (our own limit refused the arm) or a call the upstream never answered teaches nothing.
        if choice.propensity is None or upstream_ok is None or choice.spilled_from:
            return
        reward = self.scheduler.learn(choice.model.name, choice.channel, ctx.tenant_name, choice.arm, ok=ok,
                                      latency_s=latency_s, cost=cost, now=time.monotonic())
        ARM_REWARD.labels(choice.strategy, choice.arm).inc(reward)

    def record_hit(self, ctx: RequestContext, choice: Choice, *, latency_s: float, usage: Usage) -> float:
        """A response-cache hit: no upstream call (no scheduler feedback, no spend, no budget), metered
        as a hit with the cost it saved (the stored answer's usage at today's price); returns that."""
        model, cluster = choice.model.name, choice.deployment.cluster
        requests_series(model, cluster, 200).inc()
        tier = ctx.tenant.tier if ctx.tenant else "-"
        tin, tout, cache = usage.input_tokens, usage.output_tokens, usage.cache
        saved, _ = charge(choice.deployment.cost or choice.model.cost, tin, tout, cache.read, cache.write,
                          cache.write_1h)
        ctx.outcome = CallOutcome(model, cluster, 200, 0, 0)
        if self.metering is not None:  # tokens 0: none were spent; what the answer held is in the saving
            self.metering.record((
                time.time(), ctx.task_id, ctx.tenant_name, tier, model, cluster, choice.channel, 200,
                latency_s * 1000, None, 0, 0, 0.0, choice.strategy, choice.arm,
                ctx.caller.key_id if ctx.caller is not None else None, 0, 0, 0, saved, 1, None))
        if choice.reservation is not None and self.limiter is not None:  # the request counted; no tokens
            self._reconcile(choice, 0)
        return saved

    def release(self, choice: Choice) -> None:
        """Accepted for later (Prefer: respond-async): hand the token estimate back, meter nothing;
        the replay is charged, reconciled and metered as the request itself."""
        choice.release_slot()  # none is taken for a deferred request; never keep one if it was
        if choice.reservation is not None and self.limiter is not None:
            self._reconcile(choice, 0)

    def _reconcile(self, choice: Choice, tokens: int) -> None:
        """The reservation corrected to `tokens`: in place for memory buckets; a task for Redis's."""
        limiter = self.limiter
        assert limiter is not None
        if limiter.reconcile_now(choice.reservation, tokens):
            return
        task = asyncio.get_running_loop().create_task(limiter.reconcile(choice.reservation, tokens))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def record_failure(self, cluster: str, tenant: str) -> None:
        """A deployment failed `tenant`'s call before answering (Envoy failed over to a peer)."""
        _tripped(self.scheduler.record(cluster, 0.0, False, now=time.monotonic(), tenant=tenant))

    async def close(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self.metering is not None:
            await asyncio.to_thread(self.metering.close)
