"""Where a request goes and whether it may go now: the scheduler's pick, then the rate limiter."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from adapters.internal import ChatRequest, ImagePart, estimate_prompt_tokens
from contracts.config import GatewayConfig
from contracts.envoy_names import CHANNEL_HEADER, QUEUE_WAIT_HEADER, STRATEGY_HEADER
from contracts.errors import BudgetExhausted, ClientError, ModelyardError
from contracts.watermarks import Reading
from extproc.admission.budget_guard import BudgetGuard
from extproc.admission.choice import Choice
from extproc.admission.concurrency import ConcurrencyLimits
from extproc.context import RequestContext
from extproc.routing import NoRoute, RouteRequest, Scheduler
from extproc.routing.bandit import ADAPTIVE
from extproc.routing.decision import FailOpen
from extproc.telemetry.demand import DEMAND
from extproc.telemetry.metering import DecisionRecord
from extproc.telemetry.metrics import BANDIT_PICKS, BREAKER_TRIPS, BUDGET_REFUSED, FAIL_OPEN, FAIL_OPEN_ACTIVE, SPILLED
from ratelimit import Limiter
from ratelimit import RequestContext as RateLimitContext

log = logging.getLogger("modelyard.dispatch")

_FAIL_OPEN_WHY: dict[FailOpen, str] = {
    "cooldown": "every deployment is cooling down; serving from them rather than refusing the model",
    "watermarks": "no deployment has a fresh watermark reading; routing as if unmonitored",
    "warming": "every deployment is still warming up; serving from them rather than refusing the model",
}

# The rate-limit charge when a request does not say how many tokens it may produce.
DEFAULT_OUTPUT_TOKENS = 256


class ReadingSource(Protocol):
    """The last watermark reading per cluster (the pollers fill it in the background)."""

    @property
    def readings(self) -> Mapping[str, Reading]: ...


class DecisionSink(Protocol):
    """Where every rate-limit decision goes (the metering store's `decisions` table)."""

    def record_decision(self, rec: DecisionRecord | tuple) -> bool: ...  # a record, or its values in order


class Dispatcher:
    def __init__(self, scheduler: Scheduler, limiter: Limiter | None = None,
                 watermarks: ReadingSource | None = None, limits: ConcurrencyLimits | None = None,
                 decisions: DecisionSink | None = None, budgets: BudgetGuard | None = None) -> None:
        self.scheduler = scheduler
        self.limiter = limiter
        self.decisions = decisions
        self.budgets = budgets
        self.watermarks = watermarks
        self.limits = limits if limits is not None else ConcurrencyLimits(scheduler.config)
        self._failing_open: dict[str, set[FailOpen]] = {}  # by model
        _spill_series(scheduler.config)
        for b in scheduler.breakers.all:  # every trip series exists at 0 from the start
            BREAKER_TRIPS.labels(b.group, "error_rate")
        for sb in scheduler.shares.all:
            for m in sb.members:
                BREAKER_TRIPS.labels(sb.label(m), "share")

    def choose(self, route: RouteRequest) -> Choice:
        """The scheduler's pick (filter, score, admission) as a Choice; `NoRoute` when none."""
        d = self.scheduler.decide(route, time.monotonic(), self.watermarks.readings if self.watermarks else {},
                                  occupancy=self.limits.occupancy)
        if d.fail_open or route.model in self._failing_open:
            self._note_fail_open(route.model, set(d.fail_open))
        for t in d.share_trips:
            BREAKER_TRIPS.labels(t.label, "share").inc()
            log.warning("share breaker %s tripped: %s took %.0f%% of %d calls (max %.0f%%); routing to the group's "
                        "other models for %gs and until its share falls", t.settings.name, t.member, t.share * 100,
                        t.calls, t.settings.max_share * 100, t.settings.open_s)
        c = d.chosen
        DEMAND.touch(c.deployment.cluster)
        peers = tuple(p.deployment for p in d.candidates[1:] if p.model_config is c.model_config
                      and p.channel == c.channel and p.deployment.cluster != c.deployment.cluster)
        around = tuple(sorted({r.reason for r in d.rejected if r.check in ("breaker", "share")})) \
            if self.scheduler.breakers or self.scheduler.shares else ()
        if d.learned is not None:  # the bandit's pick: metered as strategy `adaptive`, arm = the cluster it chose
            BANDIT_PICKS.labels(c.model, c.channel, d.learned.arm).inc()
            return Choice(model=c.model_config, deployment=c.deployment, channel=c.channel, strategy=ADAPTIVE,
                          arm=d.learned.arm, peers=peers, propensity=d.learned.propensity, routed_around=around)
        return Choice(model=c.model_config, deployment=c.deployment, channel=c.channel, strategy=d.strategy,
                      arm=d.arm, peers=peers, routed_around=around)

    def deployment_states(self) -> dict[str, str]:
        """Each deployment's state now (modelyard_deployment_state): cooldown, warming, else its slots' state."""
        now = time.monotonic()
        stats = dict(self.scheduler.feedback.stats)  # a copy: the metrics thread reads while the loop writes
        out = {}
        for cluster in self.scheduler.config.clusters():
            st = stats.get(cluster)
            if st is not None and st.cooldown_until > now:
                out[cluster] = "cooldown"
            elif cluster in self.scheduler.warming:
                out[cluster] = "warming"
            else:
                out[cluster] = self.limits.state(cluster)
        return out

    def _note_fail_open(self, model: str, now_open: set[FailOpen]) -> None:
        """Count every fail-open decision; log when one starts and when it ends, not per request."""
        was_open = self._failing_open.pop(model, set())
        if now_open:
            self._failing_open[model] = now_open
        for check in now_open:
            FAIL_OPEN.labels(check).inc()
        for check in now_open - was_open:
            FAIL_OPEN_ACTIVE.labels(check).inc()
            log.warning("routing fails open (%s) for %r: %s", check, model, _FAIL_OPEN_WHY[check])
        for check in was_open - now_open:
            FAIL_OPEN_ACTIVE.labels(check).dec()
            log.warning("routing for %r no longer fails open (%s)", model, check)

    def choose_for(self, ctx: RequestContext, route: RouteRequest) -> Choice:
        """`choose`, inside the request's routing span when tracing is on."""
        with ctx.span("routing"):
            try:
                choice = self.choose(route)
            except NoRoute as e:
                breakers = sorted({r.reason for r in e.rejected if r.check == "breaker"})
                if breakers:  # the audit row says which group breaker refused (or routed around) the call
                    ctx.routing = {"reason": "group breaker open", "breakers": breakers}
                raise
        if choice.propensity is not None:
            ctx.routing = {"strategy": ADAPTIVE, "arm": choice.arm, "propensity": round(choice.propensity, 6)}
        if choice.routed_around:  # served past an open group breaker (a spill): the audit row says so
            ctx.routing = {**(ctx.routing or {}), "routed_around": list(choice.routed_around)}
        if ctx.trace is not None:
            d = choice.deployment
            ctx.trace.routed(route.model, choice.model.name, d.cluster, d.protocol, choice.channel, choice.strategy)
        return choice

    async def choose_chat(self, ctx: RequestContext, req: ChatRequest) -> Choice:
        choice = self.route_chat(ctx, req)
        await self.admit_chat(ctx, choice, req)
        return choice

    def route_chat(self, ctx: RequestContext, req: ChatRequest) -> Choice:
        """Where a chat request goes, not yet admitted (the response cache asks between the two)."""
        assert ctx.tenant is not None
        prompt_tokens = estimate_prompt_tokens(req)
        choice = self.choose_for(ctx, RouteRequest(
            model=req.model, tenant=ctx.tenant, strategy_override=ctx.headers.get(STRATEGY_HEADER),
            want_fast=ctx.headers.get(CHANNEL_HEADER, "").lower() == "fast",
            est_prompt_tokens=prompt_tokens, est_output_tokens=req.max_tokens,
            needs_tools=bool(req.tools),
            needs_vision=any(type(p) is ImagePart for m in req.messages for p in m.content),
            stream=req.stream, task_type=req.task, task_id=ctx.task_id))  # "completion": /v1/completions
        choice.est_prompt_tokens = prompt_tokens
        return choice

    async def admit_chat(self, ctx: RequestContext, choice: Choice, req: ChatRequest) -> None:
        self.spill_past_full_queue(ctx, choice)
        await self.admit(ctx, choice, choice.est_prompt_tokens + (req.max_tokens or DEFAULT_OUTPUT_TOKENS))
        await self.wait_for_slot(ctx, choice)

    async def admit_hit(self, ctx: RequestContext, choice: Choice) -> None:
        """A response-cache hit: the request-rate buckets count it (a caller's calls are load on the
        gateway and a rate limit is a promise about calls); no budget and no token is charged (no
        upstream spend), and no deployment slot is taken (nothing goes upstream)."""
        await self.admit(ctx, choice, 0, budgets=False)

    async def choose_embedding(self, ctx: RequestContext, model: str, est_tokens: int, longest_input: int, *,
                               slot: bool = True) -> Choice:
        """Route (task type `embedding`) and admit an embeddings request: input tokens, no output.
        Each input is embedded on its own, so the context window is checked against the longest.
        `slot=False`: the caller takes its slot itself, or none (a batch member shares its leader's call)."""
        assert ctx.tenant is not None
        choice = self.choose_for(ctx, RouteRequest(
            model=model, tenant=ctx.tenant, strategy_override=ctx.headers.get(STRATEGY_HEADER),
            want_fast=ctx.headers.get(CHANNEL_HEADER, "").lower() == "fast",
            est_prompt_tokens=longest_input, est_output_tokens=0, task_type="embedding", task_id=ctx.task_id))
        choice.est_prompt_tokens = est_tokens
        self.spill_past_full_queue(ctx, choice)
        await self.admit(ctx, choice, est_tokens)
        if slot:
            await self.wait_for_slot(ctx, choice)  # the deployment's queue, as for chat
        return choice

    def spill_past_full_queue(self, ctx: RequestContext, choice: Choice) -> None:
        """Before any bucket is charged: a deployment whose queue would refuse this caller hands the
        call to the first peer whose queue would not; with none, it stays and its queue answers."""
        tenant = ctx.tenant
        if tenant is None or ctx.deferred or not choice.peers:
            return
        reason = self.limits.refusal_reason(choice.deployment.cluster, tenant.name, tenant.tier)
        if reason is None:
            return
        for i, peer in enumerate(choice.peers):
            if self.limits.refusal_reason(peer.cluster, tenant.name, tenant.tier) is None:
                choice.peers = choice.peers[i:]
                _spill(choice, reason)
                return

    async def wait_for_slot(self, ctx: RequestContext, choice: Choice) -> None:
        """Past admission, before dispatch: a slot on the chosen deployment, waiting in its queue if
        need be. Refused (429 / 503), the request hands its rate-limit charge back."""
        cluster = choice.deployment.cluster
        # Accepted for later (Prefer: respond-async): the 202 takes no slot; the replay queues.
        if cluster not in self.limits or ctx.tenant is None or ctx.deferred:
            return
        try:
            choice.slot = await self.limits.acquire(cluster, choice.model.name, ctx.tenant.name, ctx.tenant.tier)
        except ModelyardError:
            if self.limiter is not None and choice.reservation is not None:
                await self.limiter.reconcile(choice.reservation, 0)
            raise

    async def own_call_slot(self, ctx: RequestContext, choice: Choice) -> None:
        """A batching model's request that makes its own upstream call after all (it cannot join a batch,
        the batcher declines it, or its batch fell back) holds a slot like any other request: taken once,
        released when it is metered or its stream ends. A batch's merged call takes none."""
        if choice.slot is not None:
            return
        await self.wait_for_slot(ctx, choice)
        if choice.slot is not None:  # routing's headers went out before the slot: add its queue wait
            ctx.response_headers.append((QUEUE_WAIT_HEADER, f"{choice.slot.waited_s * 1000:.1f}"))

    async def admit(self, ctx: RequestContext, choice: Choice, est_tokens: int, *, budgets: bool = True) -> None:
        """Refuse a caller whose key's or tenant's budget is spent; then charge the key's own, tenant's,
        tier's, cluster's, channel's and global buckets, all or none."""
        if budgets and self.budgets is not None:
            self._check_budgets(ctx, choice, est_tokens)
        if self.limiter is None or ctx.tenant is None:
            return
        caller = ctx.caller
        key = caller if caller is not None and (caller.rpm is not None or caller.tpm is not None) else None
        # enforce: envoy charges the rules' buckets in Envoy; a key's own ones only the extproc knows.
        rules = self.limiter.config.enforce == "extproc"
        if not rules and key is None:
            return
        # A task's replay: its acceptance counted the request (and gave its token estimate back).
        rl_ctx = RateLimitContext(ctx.tenant.name, ctx.tenant.tier, choice.deployment.cluster, choice.channel)
        requests = 0 if ctx.replayed else 1
        with ctx.span("admission") as span:
            decision = await self.limiter.acquire(rl_ctx, est_tokens, requests=requests, key=key, rules=rules)
            # Refused by this deployment's own cluster bucket (nothing was charged: all or none): a
            # peer deployment of the same model takes the call rather than the caller a 429.
            while (not decision.allowed and decision.limited_by.startswith("cluster:") and choice.peers
                   and not decision.too_large):
                _spill(choice, "cluster_bucket")
                rl_ctx = RateLimitContext(ctx.tenant.name, ctx.tenant.tier, choice.deployment.cluster, choice.channel)
                decision = await self.limiter.acquire(rl_ctx, est_tokens, requests=requests, key=key, rules=rules)
            if span is not None:
                span.set_attributes({"modelyard.ratelimit.allowed": decision.allowed,
                                     "modelyard.ratelimit.estimated_tokens": est_tokens})
        if self.decisions is not None:
            # The whole demand, refusals included: the tuner replays this, not only what was served.
            # A DecisionRecord's values as a plain tuple: the row itself, nothing built per field.
            self.decisions.record_decision((
                time.time(), ctx.task_id, ctx.tenant.name, ctx.tenant.tier, choice.deployment.cluster,
                choice.channel, choice.model.name, decision.allowed, requests, est_tokens, decision.limited_by,
                self.limiter.bound_rule(rl_ctx, decision), decision.store, caller.key_id if caller is not None else None))
        if not decision.allowed:
            if decision.too_large:
                raise ClientError(f"request needs about {est_tokens} tokens, more than the limit allows "
                                  f"({decision.limited_by})", status=429, headers=decision.headers())
            raise ClientError(f"rate limit exceeded ({decision.limited_by}); retry in "
                              f"{decision.retry_after_s:.1f}s", status=429, headers=decision.headers())
        choice.reservation = decision.reservation
        choice.ratelimit_headers = decision.headers()

    def _check_budgets(self, ctx: RequestContext, choice: Choice, est_tokens: int) -> None:
        """Before any bucket is charged: a spent budget refuses (429 `insufficient_quota`, retry-after
        = until its period resets); the refusal is a `decisions` row like a rate-limit refusal."""
        assert self.budgets is not None
        refused = self.budgets.refusal(ctx)
        if refused is None:
            return
        spent, retry_after = refused
        BUDGET_REFUSED.labels(spent.scope).inc()
        if self.decisions is not None and ctx.tenant is not None:
            self.decisions.record_decision(DecisionRecord(
                time.time(), ctx.task_id, ctx.tenant.name, ctx.tenant.tier, choice.deployment.cluster,
                choice.channel, choice.model.name, False, 0 if ctx.replayed else 1, est_tokens,
                f"budget:{spent.scope}:{spent.id}", f"{spent.budget.usd:g} usd per {spent.budget.period}", "budget",
                ctx.caller.key_id if ctx.caller is not None else None))
        raise BudgetExhausted(f"budget exhausted: {spent.describe()}", retry_after_s=retry_after)


# Why a call spilled (modelyard_spilled_total's reason label; docs/routing.md, "Spill").
SPILL_REASONS = ("cluster_bucket", "bound", "tenant_share")


def _spill(choice: Choice, reason: str) -> None:
    was = choice.deployment.cluster
    choice.spill()
    SPILLED.labels(choice.model.name, was, choice.deployment.cluster, reason).inc()
    DEMAND.touch(choice.deployment.cluster)


def _spill_series(config: GatewayConfig) -> None:
    """Every spill series a config can produce exists from the start at 0 (autoscalers read rates of it)."""
    for m in config.models:
        for a in m.deployments:
            for b in m.deployments:
                if a.cluster != b.cluster and a.channel == b.channel:
                    for reason in SPILL_REASONS:
                        SPILLED.labels(m.name, a.cluster, b.cluster, reason)
