"""The routing decision: filter, then score, then pick (with fast-channel admission in the filter).

`Scheduler.decide` is synchronous and does no I/O: it reads the config (indexed once at
construction), the live feedback it keeps itself, and the watermark readings passed in. It
returns every usable deployment best first so the caller can fail over, or raises a `NoRoute`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping

from contracts.config import GatewayConfig, TenantConfig
from contracts.config.routing import RoutingSettings, Weights
from contracts.watermarks import Reading
from extproc.routing import filters
from extproc.routing.admission import FastAdmission
from extproc.routing.bandit import Bandit, GroupKey, call_reward
from extproc.routing.breaker import STATE_VALUE, Breakers, GroupBreaker
from extproc.routing.decision import Arm, Candidate, Decision, FailOpen, Learned, Rejection, RouteRequest
from extproc.routing.errors import BadRouteRequest, NoCapacity, NoRoute
from extproc.routing.feedback import Feedback, StatsLookup
from extproc.routing.index import Entry, entries_of, groups_of
from extproc.routing.latency import LatencyBook
from extproc.routing.score import pick, score
from extproc.routing.share_breaker import ShareBreakers

_SHAPE_CACHE_SIZE = 1024
_AB_SCALE = 2**64
# The request fields the static checks read: decisions with equal shapes share one filter pass.
_Shape = tuple[tuple[str, ...], str, bool, bool, bool, bool]


class Scheduler:
    def __init__(self, config: GatewayConfig, settings: RoutingSettings | None = None) -> None:
        """`settings` overrides `config.routing` (tests); load_config has checked tenants' strategies."""
        self.config = config
        self.settings = settings if settings is not None else config.routing
        s = self.settings
        self.feedback = Feedback(s.feedback, s.cooldown)
        self.admission = FastAdmission(s.admission)
        # Measured latency against each deployment's objective (`slo:`); shared across reloads like feedback.
        self.latency = LatencyBook({c: d.slo for c, d in config.clusters().items() if d.slo is not None})
        self._entries: dict[str, tuple[Entry, ...]] = {m.name: entries_of(m) for m in config.models}
        self._groups = groups_of(config.models)
        self._shapes: dict[_Shape, tuple[tuple[Entry, ...], tuple[Rejection, ...]]] = {}
        # Deployments whose warm-up request has not answered yet (extproc/telemetry/warmup.py).
        self.warming: set[str] = set()
        self._resolved: dict[tuple[str, str], tuple[list[str], tuple[str, ...]]] = {}
        # The learning strategy (routing.adaptive) and the total breakers over groups (routing.breakers).
        self.bandit = Bandit(s.adaptive, pending={} if s.adaptive.store == "redis" else None)
        self.breakers = Breakers(s.breakers, ((m.name, d.cluster, d.channel)
                                              for m in config.models for d in m.deployments))
        self.shares = ShareBreakers(s.share_breakers, self._groups)

    # -- public -------------------------------------------------------------------------------

    def arm_for(self, task_id: str) -> Arm:
        """'B' for a stable `share_b` fraction of task ids (hash, so tests can reproduce it)."""
        share = self.settings.ab.share_b
        if share <= 0:
            return "A"
        h = int.from_bytes(hashlib.blake2b(task_id.encode(), digest_size=8).digest(), "big")
        return "B" if h < share * _AB_SCALE else "A"

    def record(
        self, cluster: str, latency_s: float, ok: bool, ttft_s: float | None = None, *, now: float,
        tenant: str = "",
    ) -> list[GroupBreaker]:
        """Feed one finished upstream attempt (monotonic `now`) of `tenant`'s into EWMAs, cooldowns and
        group breakers; returns the breakers it tripped."""
        self.feedback.record(cluster, latency_s, ok, ttft_s, now=now, tenant=tenant)
        if ok:  # failures feed the error rate and cooldowns; a latency objective is about answers
            self.latency.record(cluster, latency_s, ttft_s, now)
        return self.breakers.record(cluster, ok, now) if self.breakers else []

    def learn(self, model: str, channel: str, tenant: str, arm: str, *, ok: bool, latency_s: float, cost: float,
              now: float) -> float:
        """Feed the learning strategy one call of the arm it chose; returns the reward it counted."""
        s = self.settings.adaptive
        reward = call_reward(s.reward, ok, latency_s, cost, latency_target_ms=s.latency_target_ms,
                             cost_target=s.cost_target)
        self.bandit.learn(self.bandit.group(model, channel, tenant), arm, reward, now)
        return reward

    def learn_feedback(self, model: str, channel: str, tenant: str, arm: str, score: float, now: float) -> None:
        """A caller's score of a call the learning strategy routed, weighed by `reward.feedback`."""
        w = self.settings.adaptive.reward
        total = w.success + w.latency + w.cost
        if w.feedback > 0 and self.bandit.learns(model):
            # Relative to one call's weight: feedback 1 with success 1 counts as much as the call did.
            weight = w.feedback / total if total > 0 else 1.0
            self.bandit.learn(self.bandit.group(model, channel, tenant), arm, score, now, weight)

    def learning_state(self, now: float) -> tuple[Iterator[tuple[GroupKey, str, dict[str, float]]], dict[str, int]]:
        """What /metrics shows of the bandit's arms and the group breakers (modelyard_bandit_arm, _breaker_state)."""
        states = {g: STATE_VALUE[st] for g, st in self.breakers.states(now).items()}
        return self.bandit.exposition(now), {**states, **self.shares.states(now)}

    def carry_learning(self, running: Scheduler) -> None:
        """A reload keeps what was learned: the bandit's evidence, and breakers whose settings stayed."""
        self.bandit.evidence, self.bandit.pending = running.bandit.evidence, running.bandit.pending
        old = {b.settings: b for b in running.breakers.all}
        for i, b in enumerate(self.breakers.all):
            kept = old.get(b.settings)
            if kept is not None:
                self.breakers.all[i] = kept
        self.breakers.reindex()
        kept_shares = {(b.settings, b.members): b for b in running.shares.all}
        self.shares.all = [kept_shares.get((b.settings, b.members), b) for b in self.shares.all]
        self.shares.reindex()

    def decide(
        self,
        req: RouteRequest,
        now: float,
        watermarks: Mapping[str, Reading],
        *,
        dry_run: bool = False,
        occupancy: Mapping[str, float] | None = None,
        slow: Mapping[str, tuple[float, str]] | None = None,
    ) -> Decision:
        """Route one request. `now` is monotonic seconds, the clock of `Reading.ts`. Consumes
        an L3 fast-trial slot when the first choice is fast, unless `dry_run`. `occupancy`: each
        limited deployment's (in flight + waiting) / max_inflight, read as load. `slow`: the
        deployments over their latency objective (default: as this scheduler measured them)."""
        members = self._resolve(req.model, req.tenant)
        strategy, arm, weights = self._weights(req)
        eligible, static_rejected = self._shape(req, members)
        occupancy = occupancy or {}
        stats = self.feedback.view(req.tenant.name, now)
        admitted, runtime_rejected, fail_open = self._runtime_filter(req, eligible, now, watermarks, occupancy,
                                                                     stats, slow)
        rejected = static_rejected + tuple(runtime_rejected)
        if not admitted:
            raise self._no_route(req.model, rejected, now)
        s = self.settings
        out_tokens = s.est_output_tokens if req.est_output_tokens is None else req.est_output_tokens
        scored = score(admitted, stats, weights, stream=req.stream,
                       prior_weight=s.feedback.prior_weight, prompt_tokens=req.est_prompt_tokens,
                       output_tokens=out_tokens)
        idle_spot = strategy in s.spot_first
        top = pick(scored, s.max_candidates, idle_spot=(lambda e: e.spot and occupancy.get(e.cluster, 0.0) < 1.0)
                   if idle_spot else None)
        candidates = tuple(scored.candidate(i) for i in top)
        learned = None
        if self.bandit.settings.models and self.bandit.learns(candidates[0].model):
            candidates, learned = self._learned(req, candidates, now)
        if not dry_run and req.want_fast and candidates[0].fast_admitted:
            self.admission.consume(req.tenant.name, req.tenant.tier, now)
        if not dry_run and self.breakers:
            self.breakers.routed(candidates[0].model, candidates[0].cluster, now)
        trips = tuple(self.shares.routed(candidates[0].model, req.model, members, now)) if not dry_run and self.shares else ()
        return Decision(candidates, strategy, arm, weights, req.want_fast, rejected, fail_open, learned, trips)

    # -- the stages ---------------------------------------------------------------------------

    def _learned(self, req: RouteRequest, candidates: tuple[Candidate, ...],
                 now: float) -> tuple[tuple[Candidate, ...], Learned]:
        """The bandit picks among the first choice's model's deployments on its channel (the filters
        have run: it learns among what may serve now); the others keep their order behind it."""
        first = candidates[0]
        arms = [c for c in candidates if c.model == first.model and c.channel == first.channel
                and c.fast_admitted == first.fast_admitted]
        if len(arms) < 2:
            return candidates, Learned(first.cluster, 1.0, {first.cluster: 1.0})
        key = self.bandit.group(first.model, first.channel, req.tenant.name)
        pick = self.bandit.choose(key, [c.cluster for c in arms], now)
        chosen = next(c for c in arms if c.cluster == pick.arm)
        return (chosen, *(c for c in candidates if c is not chosen)), Learned(pick.arm, pick.propensity, pick.shares)

    def _weights(self, req: RouteRequest) -> tuple[str, Arm, Weights]:
        """The strategy in force, the A/B arm and the weight set that arm scores with."""
        s = self.settings
        strategy = req.strategy_override or req.tenant.strategy
        weights = s.strategies.get(strategy)
        if weights is None:
            known = ", ".join(sorted(s.strategies))
            raise BadRouteRequest(f"unknown strategy {strategy[:64]!r} (known: {known})")
        weights_b = s.ab.weights_b.get(strategy)
        if weights_b is not None and self.arm_for(req.task_id) == "B":
            return strategy, "B", weights_b
        return strategy, "A", weights

    def _shape(
        self, req: RouteRequest, members: tuple[str, ...]
    ) -> tuple[tuple[Entry, ...], tuple[Rejection, ...]]:
        """The entries that pass the static checks, cached per request shape."""
        key: _Shape = (members, req.task_type, req.needs_tools, req.needs_vision, req.stream, req.want_fast)
        hit = self._shapes.get(key)
        if hit is not None:
            return hit
        eligible: list[Entry] = []
        rejected: list[Rejection] = []
        for name in members:
            for e in self._entries[name]:
                rejection = filters.static_rejection(e, req)
                if rejection is None:
                    eligible.append(e)
                else:
                    rejected.append(rejection)
        out = (tuple(eligible), tuple(rejected))
        if len(self._shapes) >= _SHAPE_CACHE_SIZE:
            self._shapes.clear()  # bounded: task types and flags give few shapes in practice
        self._shapes[key] = out
        return out

    def _runtime_filter(
        self, req: RouteRequest, eligible: tuple[Entry, ...], now: float, watermarks: Mapping[str, Reading],
        occupancy: Mapping[str, float], stats: StatsLookup, slow: Mapping[str, tuple[float, str]] | None,
    ) -> tuple[list[tuple[Entry, float, bool]], list[Rejection], tuple[FailOpen, ...]]:
        """The entries that pass every runtime check, with their watermark and whether they are
        admitted as fast use; the others' rejections, in config order; the checks set aside."""
        s = self.settings
        dropped: filters.Rejected = []
        fail_open: list[FailOpen] = []
        entries = filters.reserved(list(eligible), req.tenant, dropped)
        entries = filters.context_window(entries, req.est_prompt_tokens, dropped)
        over: filters.Rejected = []
        capped = filters.max_output(entries, req.est_output_tokens, over)
        if capped or not entries or s.output_limit == "filter":
            dropped += over
            entries = capped
        # else (clamp): no model can give what was asked; all stay, and the flow lowers the cap
        if self.breakers:
            entries = filters.breaker(entries, self.breakers, now, dropped)
        cooling: filters.Rejected = []
        cooled = filters.cooldown(entries, stats, now, cooling)
        if cooled or not entries:
            dropped += cooling
            entries = cooled
        else:  # every deployment cooling down: serve from them rather than refuse the model outright
            fail_open.append("cooldown")
        if self.warming:
            cold: filters.Rejected = []
            warm = filters.warming(entries, self.warming, cold)
            if warm or not entries:
                dropped += cold
                entries = warm
            else:  # every deployment warming up: a slow first answer beats a refusal
                fail_open.append("warming")
        dark: filters.Rejected = []
        present = filters.missing_reading(entries, watermarks, dark)
        fresh = filters.stale_reading(present, now, s.watermarks.stale_after_s, dark)
        if fresh or not dark:
            dropped += dark
            readings = fresh
        else:  # no deployment has a fresh reading: monitoring is down, not the fleet; route unmonitored
            fail_open.append("watermarks")
            readings = [(e, None) for e in entries]
        loads = filters.saturated(readings, s.saturation_threshold, s.watermarks.unmonitored, dropped)
        loads = filters.with_occupancy(loads, occupancy)
        if slow is None:  # measured here, for the candidates left only
            slow = self.latency.loaded(now, (e.cluster for e, _ in loads)) if self.latency.objectives else {}
        if slow:
            loads = filters.with_latency(loads, slow)
        if req.want_fast:
            tier = req.tenant.tier
            quota_left = self.admission.quota_left(req.tenant.name, tier, now)
            admitted = filters.fast_admission(loads, quota_left, self.admission.rule(tier), tier, dropped, slow)
        else:
            admitted = [(e, wm, False) for e, wm in loads]
        if self.shares and len(admitted) > 1:
            admitted = filters.share(admitted, self.shares, now, dropped)
        if len(dropped) > 1:
            # Each entry fails one check at most: list them as a single pass over the config would.
            position = {id(e): i for i, e in enumerate(eligible)}
            dropped.sort(key=lambda d: position[id(d[0])])
        return admitted, [r for _, r in dropped], tuple(fail_open)

    # -- private ------------------------------------------------------------------------------

    def _resolve(self, model: str, tenant: TenantConfig) -> tuple[str, ...]:
        key = (model, tenant.name)
        hit = self._resolved.get(key)
        # Keyed by name, checked by identity: a tenant from another config is resolved afresh.
        if hit is not None and hit[0] is tenant.allowed_models:
            return hit[1]
        members = filters.allowed_members(model, tenant, self._entries, self._groups)
        self._resolved[key] = (tenant.allowed_models, members)
        return members

    def _no_route(self, model: str, rejected: tuple[Rejection, ...], now: float) -> NoRoute:
        runtime = [r for r in rejected if r.runtime]
        if runtime and all(r.check == "breaker" for r in runtime):
            # Every deployment left sits behind an open group breaker: fail fast until it half-opens.
            wait = min((b.retry_after(now) for r in runtime
                        if (b := self.breakers.blocking(r.model, r.cluster, now)) is not None), default=1.0)
            return NoCapacity(f"no deployment of {model!r} is available now: "
                              + "; ".join(sorted({r.reason for r in runtime})),
                              rejected=rejected, retry_after_s=max(wait, 1.0))
        if runtime:
            # Saturated by real readings (cooldowns and dark monitoring fail open): the next reading may differ.
            return NoCapacity(f"no deployment of {model!r} is available now", rejected=rejected,
                              retry_after_s=self.settings.watermarks.interval_s)
        reasons = sorted({r.reason for r in rejected if r.check != "channel"})
        detail = "; ".join(reasons) or "no deployment"
        return BadRouteRequest(f"no deployment of {model!r} can serve this request: {detail}", rejected=rejected)
