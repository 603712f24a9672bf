"""The routing decision: capability filter, then a weighted score, then fast-channel admission.

`Scheduler.decide` is synchronous and does no I/O: it reads the config (indexed once at
construction), the live feedback it keeps itself, and the watermark readings passed in. It
returns every usable deployment best first so the caller can fail over, or raises `NoRoute`.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from extproc.routing.admission import FastAdmission, tier_allows
from extproc.routing.feedback import Feedback
from extproc.routing.settings import RoutingSettings, Weights
from extproc.routing.watermarks import Reading

if TYPE_CHECKING:
    # Annotations only: extproc.config holds RoutingSettings, so a runtime import would be a cycle.
    from extproc.config import Deployment, GatewayConfig, ModelConfig, TenantConfig

AUTO = "auto"
_SHAPE_CACHE_SIZE = 1024
STRATEGY_HEADER = "x-modelyard-strategy"
CHANNEL_HEADER = "x-modelyard-channel"


class NoRoute(Exception):
    """No deployment can take the request. `status`: 404 unknown or not allowed model (the same
    message for both so tenants cannot probe), 400 bad strategy or a request no model can serve,
    503 every capable deployment is cooling down or saturated (`retry_after_s` when known)."""

    def __init__(
        self,
        status: int,
        message: str,
        rejected: tuple["Rejection", ...] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.rejected = rejected
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class RouteRequest:
    model: str
    tenant: TenantConfig
    strategy_override: str | None = None
    want_fast: bool = False
    est_prompt_tokens: int = 0
    # Caps output tokens for the cost estimate; None uses routing.est_output_tokens.
    est_output_tokens: int | None = None
    needs_tools: bool = False
    needs_vision: bool = False
    stream: bool = False
    task_type: str = "chat"
    task_id: str = ""


@dataclass(frozen=True, slots=True)
class Candidate:
    model: str
    deployment: Deployment
    channel: str
    score: float
    terms: Mapping[str, float]
    model_config: ModelConfig
    # Admitted to the fast channel (counts as fast use); False for fast-only models serving
    # a request that was not admitted or did not ask.
    fast_admitted: bool = False

    @property
    def cluster(self) -> str:
        return self.deployment.cluster


@dataclass(frozen=True, slots=True)
class Rejection:
    model: str
    cluster: str
    reason: str
    # Runtime reasons (cooldown, watermark, admission) pass; static ones (capabilities) do not.
    runtime: bool


@dataclass(frozen=True, slots=True)
class Decision:
    candidates: tuple[Candidate, ...]
    strategy: str
    arm: str
    weights: Weights
    fast_requested: bool
    rejected: tuple[Rejection, ...] = ()

    @property
    def chosen(self) -> Candidate:
        return self.candidates[0]

    @property
    def channel(self) -> str:
        """The channel of the first choice; after a failover use that candidate's `channel`."""
        return self.candidates[0].channel

    @property
    def downgraded(self) -> bool:
        """Asked for fast and not admitted: silently served on the standard channel (or on a
        fast-only model's deployment without counting as fast use)."""
        return self.fast_requested and not self.candidates[0].fast_admitted


@dataclass(slots=True)
class _Entry:
    """One (model, deployment) pair with everything the filter and score read, precomputed."""

    model: ModelConfig
    dep: Deployment
    name: str
    cluster: str
    fast: bool
    # The model has no standard deployment, so its fast ones also carry standard traffic.
    fast_only_model: bool
    quality: float
    prior_latency_s: float
    cost_in: float
    cost_out: float
    context_window: int
    tools: bool
    vision: bool
    streaming: bool
    task_types: frozenset[str]
    monitored: bool


class Scheduler:
    def __init__(self, config: GatewayConfig, settings: RoutingSettings | None = None) -> None:
        """`settings` overrides `config.routing` (tests); load_config has checked tenants' strategies."""
        self.config = config
        self.settings = settings if settings is not None else config.routing
        s = self.settings
        self.feedback = Feedback(s.feedback, s.cooldown)
        self.admission = FastAdmission(s.admission)
        self._entries: dict[str, tuple[_Entry, ...]] = {}
        self._groups: dict[str, tuple[str, ...]] = {}
        for m in config.models:
            only_fast = all(d.channel == "fast" for d in m.deployments)
            self._entries[m.name] = tuple(
                _Entry(
                    model=m,
                    dep=d,
                    name=m.name,
                    cluster=d.cluster,
                    fast=d.channel == "fast",
                    fast_only_model=only_fast,
                    quality=m.quality,
                    prior_latency_s=m.latency_ms / 1000.0,
                    cost_in=m.cost.input_per_1k,
                    cost_out=m.cost.output_per_1k,
                    context_window=m.capabilities.context_window,
                    tools=m.capabilities.tools,
                    vision=m.capabilities.vision,
                    streaming=m.capabilities.streaming,
                    task_types=frozenset(m.task_types),
                    monitored=d.watermark is not None,
                )
                for d in m.deployments
            )
            for g in m.groups:
                self._groups[g] = self._groups.get(g, ()) + (m.name,)
        # `auto` without a declared group of that name means every model.
        self._groups.setdefault(AUTO, tuple(m.name for m in config.models))
        self._ab_scale = 2**64
        self._shapes: dict[tuple, tuple[tuple[_Entry, ...], tuple[Rejection, ...]]] = {}
        self._resolved: dict[tuple[str, str], tuple[list[str], tuple[str, ...]]] = {}

    # -- public -------------------------------------------------------------------------------

    def arm_for(self, task_id: str) -> str:
        """'B' for a stable `share_b` fraction of task ids (hash, so tests can reproduce it)."""
        share = self.settings.ab.share_b
        if share <= 0:
            return "A"
        h = int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "big")
        return "B" if h < share * self._ab_scale else "A"

    def record(
        self, cluster: str, latency_s: float, ok: bool, ttft_s: float | None = None, *, now: float
    ) -> None:
        """Feed one finished upstream attempt (monotonic `now`) into EWMAs and cooldowns."""
        self.feedback.record(cluster, latency_s, ok, ttft_s, now=now)

    def decide(
        self,
        req: RouteRequest,
        now: float,
        watermarks: Mapping[str, Reading],
        *,
        dry_run: bool = False,
    ) -> Decision:
        """Route one request. `now` is monotonic seconds, the clock of `Reading.ts`. Consumes
        an L3 fast-trial slot when the first choice is fast, unless `dry_run`."""
        members = self._resolve(req.model, req.tenant)
        strategy = req.strategy_override or req.tenant.strategy
        s = self.settings
        weights = s.strategies.get(strategy)
        if weights is None:
            known = ", ".join(sorted(s.strategies))
            raise NoRoute(400, f"unknown strategy {strategy[:64]!r} (known: {known})")
        arm = "A"
        weights_b = s.ab.weights_b.get(strategy)
        if weights_b is not None and self.arm_for(req.task_id) == "B":
            arm, weights = "B", weights_b

        tier = req.tenant.tier
        rule = self.admission.rule(tier)
        want_fast = req.want_fast
        quota_ok = want_fast and self.admission.quota_left(req.tenant.name, tier, now)
        stale_s = s.watermarks.stale_after_s
        sat = s.saturation_threshold
        unmonitored = s.watermarks.unmonitored
        out_tokens = s.est_output_tokens if req.est_output_tokens is None else req.est_output_tokens
        prompt = req.est_prompt_tokens
        stream = req.stream
        k = s.feedback.prior_weight
        stats = self.feedback.stats

        eligible, static_rejected = self._shape(req, members)
        rejected: list[Rejection] = list(static_rejected)
        # (entry, watermark, expected latency s, cost estimate, error rate, admitted as fast)
        pool: list[tuple[_Entry, float, float, float, float, bool]] = []
        soonest_cooldown_end: float | None = None
        for e in eligible:
            if prompt > e.context_window:
                rejected.append(
                    Rejection(
                        e.name,
                        e.cluster,
                        f"prompt ~{prompt} tokens exceeds context window {e.context_window}",
                        False,
                    )
                )
                continue
            st = stats.get(e.cluster)
            if st is not None and st.cooldown_until > now:
                until = st.cooldown_until
                if soonest_cooldown_end is None or until < soonest_cooldown_end:
                    soonest_cooldown_end = until
                rejected.append(
                    Rejection(e.name, e.cluster, f"cooling down ({until - now:.1f}s left)", True)
                )
                continue
            if e.monitored:
                r = watermarks.get(e.cluster)
                if r is None:
                    rejected.append(Rejection(e.name, e.cluster, "no watermark reading", True))
                    continue
                if now - r.ts > stale_s:
                    rejected.append(
                        Rejection(e.name, e.cluster, f"stale watermark ({now - r.ts:.1f}s old)", True)
                    )
                    continue
                wm = r.watermark
                if r.saturated or wm >= sat:
                    rejected.append(
                        Rejection(e.name, e.cluster, f"saturated (watermark {wm:.2f})", True)
                    )
                    continue
            else:
                wm = unmonitored
            as_fast = False
            if want_fast and e.fast:
                if not quota_ok:
                    why = "fast trial quota used"
                elif not tier_allows(rule, wm):
                    why = f"fast channel closed to {tier} at watermark {wm:.2f}"
                else:
                    why = ""
                if not why:
                    as_fast = True
                elif not e.fast_only_model:
                    rejected.append(Rejection(e.name, e.cluster, why, True))
                    continue
            lat = e.prior_latency_s
            err = 0.0
            if st is not None:
                err = st.error_rate
                if stream and st.ttft_n:
                    lat = (lat * k + st.ttft_s * st.ttft_n) / (k + st.ttft_n)
                elif st.latency_n:
                    lat = (lat * k + st.latency_s * st.latency_n) / (k + st.latency_n)
            cost = (prompt * e.cost_in + out_tokens * e.cost_out) / 1000.0
            pool.append((e, wm, lat, cost, err, as_fast))

        if not pool:
            raise self._no_route(req.model, tuple(rejected), soonest_cooldown_end, now)

        wq, wl, wc, wload = weights.normalised()
        lats = [p[2] for p in pool]
        costs = [p[3] for p in pool]
        lat_lo, cost_lo = min(lats), min(costs)
        lat_span, cost_span = max(lats) - lat_lo, max(costs) - cost_lo
        keys = []
        for i, (e, wm, lat, cost, err, as_fast) in enumerate(pool):
            # Min-max across the candidate set: the fastest / cheapest gets 1, the slowest 0.
            t_lat = 1.0 - (lat - lat_lo) / lat_span if lat_span > 0 else 1.0
            t_cost = 1.0 - (cost - cost_lo) / cost_span if cost_span > 0 else 1.0
            base = wq * e.quality + wl * t_lat + wc * t_cost + wload * (1.0 - wm)
            # Admitted fast deployments first, then standard ones as failover; best score
            # first; config order breaks ties so decisions are reproducible.
            keys.append((not as_fast, -base * (1.0 - err), i))
        limit = s.max_candidates
        top = heapq.nsmallest(limit, keys) if 0 < limit < len(keys) else sorted(keys)
        candidates = tuple(
            self._candidate(pool[i], -neg, lat_lo, lat_span, cost_lo, cost_span)
            for _, neg, i in top
        )
        if not dry_run and want_fast and pool[top[0][2]][5]:
            self.admission.consume(req.tenant.name, tier, now)
        return Decision(candidates, strategy, arm, weights, want_fast, tuple(rejected))

    @staticmethod
    def _candidate(
        p: tuple[_Entry, float, float, float, float, bool],
        score: float,
        lat_lo: float,
        lat_span: float,
        cost_lo: float,
        cost_span: float,
    ) -> Candidate:
        e, wm, lat, cost, err, admitted = p
        terms = {
            "quality": e.quality,
            "latency": 1.0 - (lat - lat_lo) / lat_span if lat_span > 0 else 1.0,
            "cost": 1.0 - (cost - cost_lo) / cost_span if cost_span > 0 else 1.0,
            "load": 1.0 - wm,
            "error_rate": err,
            "latency_s": lat,
            "cost_est": cost,
            "watermark": wm,
        }
        channel = "fast" if e.fast else "standard"
        return Candidate(e.name, e.dep, channel, score, terms, e.model, admitted)

    def _shape(
        self, req: RouteRequest, members: tuple[str, ...]
    ) -> tuple[tuple[_Entry, ...], tuple[Rejection, ...]]:
        """The entries that pass the request-independent checks, cached per request shape."""
        key = (members, req.task_type, req.needs_tools, req.needs_vision, req.stream, req.want_fast)
        hit = self._shapes.get(key)
        if hit is not None:
            return hit
        eligible: list[_Entry] = []
        rejected: list[Rejection] = []
        for name in members:
            for e in self._entries[name]:
                reason = self._static_reason(e, req)
                if reason is None and e.fast and not req.want_fast and not e.fast_only_model:
                    reason = "fast channel not requested"
                if reason is None:
                    eligible.append(e)
                else:
                    rejected.append(Rejection(name, e.cluster, reason, False))
        out = (tuple(eligible), tuple(rejected))
        if len(self._shapes) >= _SHAPE_CACHE_SIZE:
            self._shapes.clear()  # bounded: task types and flags give few shapes in practice
        self._shapes[key] = out
        return out

    # -- private ------------------------------------------------------------------------------

    def _resolve(self, model: str, tenant: TenantConfig) -> tuple[str, ...]:
        key = (model, tenant.name)
        hit = self._resolved.get(key)
        # Keyed by name, checked by identity: a tenant from another config is resolved afresh.
        if hit is not None and hit[0] is tenant.allowed_models:
            return hit[1]
        members = self._resolve_uncached(model, tenant)
        self._resolved[key] = (tenant.allowed_models, members)
        return members

    def _resolve_uncached(self, model: str, tenant: TenantConfig) -> tuple[str, ...]:
        not_found = NoRoute(404, f"model {model!r} not found")
        if model in self._entries:
            if not tenant.may_use(model):
                raise not_found
            return (model,)
        members = self._groups.get(model)
        if members is None:
            raise not_found
        if tenant.may_use(model):
            # Granting a group grants its members.
            return members
        allowed = tuple(m for m in members if tenant.may_use(m))
        if not allowed:
            raise not_found
        return allowed

    @staticmethod
    def _static_reason(e: _Entry, req: RouteRequest) -> str | None:
        if req.task_type not in e.task_types:
            return f"task type {req.task_type!r} not supported"
        if req.needs_tools and not e.tools:
            return "tools not supported"
        if req.needs_vision and not e.vision:
            return "images not supported"
        if req.stream and not e.streaming:
            return "streaming not supported"
        return None

    @staticmethod
    def _no_route(
        model: str, rejected: tuple[Rejection, ...], cooldown_end: float | None, now: float
    ) -> NoRoute:
        if any(r.runtime for r in rejected):
            retry = None
            if cooldown_end is not None and all(r.reason.startswith("cooling") for r in rejected if r.runtime):
                retry = max(0.0, cooldown_end - now)
            return NoRoute(503, f"no deployment of {model!r} is available now", rejected, retry)
        reasons = sorted({r.reason for r in rejected if r.reason != "fast channel not requested"})
        detail = "; ".join(reasons) or "no deployment"
        return NoRoute(400, f"no deployment of {model!r} can serve this request: {detail}", rejected)
