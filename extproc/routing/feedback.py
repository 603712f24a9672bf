"""Live feedback per cluster: EWMAs of latency, time to first token and error rate, and cooldowns.

State changes only through `record`; reads take `now` explicitly, so tests drive time by hand.
All times are seconds on the caller's monotonic clock.

Feedback heals with time: error rates decay toward zero and observed latencies lose weight
against the configured prior with `half_life_s`, so a deployment nobody sends traffic to (because
its score fell) drifts back instead of staying shunned for good. And one tenant's failures, once
another tenant's successes contradict them, steer only that tenant: the error rate a decision scores
with is then the larger of the tenant's own and the second-worst tenant's, and a cooldown they fill
covers that tenant alone (an upstream that is really down fails everyone's calls; one tenant's bad
requests do not). Uncontradicted failures count for everyone, as they must when only one tenant calls.

And feedback moves a deployment only on evidence: the error rate a decision scores with is zero
until the deployment has failed `consecutive_failures` times in a row, or has `min_samples` recent
outcomes, and then it is at most their failure share (one failure among thousands is next to
nothing; one cut stream of a deployment barely used is not yet a pattern).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from contracts.config.routing import CooldownSettings, FeedbackSettings

# Per-tenant error rates below this are forgotten: the table stays as small as the tenants failing now.
_FORGET_BELOW = 1e-3


@dataclass(slots=True)
class ClusterStats:
    latency_s: float = 0.0
    latency_n: float = 0.0  # weight of the observations, decayed with time
    ttft_s: float = 0.0
    ttft_n: float = 0.0
    error_rate: float = 0.0  # the tenant-blind EWMA as of `updated` (what metrics and explain show)
    requests: int = 0
    failures: deque[tuple[float, str]] = field(default_factory=deque)  # (when, tenant), this streak
    cooldown_until: float = 0.0  # for everyone
    updated: float = 0.0
    streak: int = 0  # failures since the last success (tenant-blind, no window)
    outcomes_w: float = 0.0  # recorded outcomes, and failures among them, decayed as of `updated`
    failures_w: float = 0.0
    # tenant -> (error-rate EWMA, as of when); tenant -> its own cooldown end
    tenant_errors: dict[str, tuple[float, float]] = field(default_factory=dict)
    tenant_cooldown: dict[str, float] = field(default_factory=dict)
    last_ok: dict[str, float] = field(default_factory=dict)  # tenant -> its latest success here


class Feedback:
    def __init__(self, feedback: FeedbackSettings, cooldown: CooldownSettings) -> None:
        self._alpha = feedback.alpha
        self._half_life = feedback.half_life_s
        self._evidence = (feedback.consecutive_failures, feedback.min_samples)
        self._cooldown = cooldown
        self.stats: dict[str, ClusterStats] = {}

    def retune(self, feedback: FeedbackSettings, cooldown: CooldownSettings, clusters: Iterable[str]) -> None:
        """A reload: new settings from now on; the stats of clusters that remain are kept, the rest dropped."""
        self._alpha, self._half_life, self._cooldown = feedback.alpha, feedback.half_life_s, cooldown
        self._evidence = (feedback.consecutive_failures, feedback.min_samples)
        keep = set(clusters)
        for gone in [c for c in self.stats if c not in keep]:
            del self.stats[gone]

    def _decay(self, dt: float) -> float:
        """The factor a value keeps over `dt` seconds."""
        if self._half_life is None or dt <= 0:
            return 1.0
        return float(0.5 ** (dt / self._half_life))

    def record(
        self, cluster: str, latency_s: float, ok: bool, ttft_s: float | None = None, *, now: float,
        tenant: str = "",
    ) -> None:
        s = self.stats.get(cluster)
        if s is None:
            s = self.stats[cluster] = ClusterStats(updated=now)
        keep = self._decay(now - s.updated)
        s.updated = now
        s.latency_n *= keep
        s.ttft_n *= keep
        a = self._alpha
        sample = 0.0 if ok else 1.0
        s.requests += 1
        s.outcomes_w = s.outcomes_w * keep + 1
        s.failures_w = s.failures_w * keep + sample
        s.streak = 0 if ok else s.streak + 1
        s.error_rate = a * sample + (1 - a) * s.error_rate * keep
        rate, since = s.tenant_errors.get(tenant, (0.0, now))
        rate = a * sample + (1 - a) * rate * self._decay(now - since)
        if rate < _FORGET_BELOW:
            s.tenant_errors.pop(tenant, None)
        else:
            s.tenant_errors[tenant] = (rate, now)
        if ok:
            s.last_ok[tenant] = now
            # Failed attempts' latency says little about serving time, so only successes count.
            s.latency_s = latency_s if s.latency_n == 0 else a * latency_s + (1 - a) * s.latency_s
            s.latency_n += 1
            if ttft_s is not None:
                s.ttft_s = ttft_s if s.ttft_n == 0 else a * ttft_s + (1 - a) * s.ttft_s
                s.ttft_n += 1
            s.failures.clear()
            return
        c = self._cooldown
        s.failures.append((now, tenant))
        while s.failures and s.failures[0][0] <= now - c.window_s:
            s.failures.popleft()
        if len(s.failures) >= c.failures:
            if len({t for _, t in s.failures}) == 1 and self._contradicted(s, tenant, now):
                s.tenant_cooldown[tenant] = now + c.cooldown_s  # its requests go elsewhere, others' stay
            else:
                s.cooldown_until = now + c.cooldown_s
            # After the cooldown the cluster gets a fresh count, so one more failure does not
            # send it straight back.
            s.failures.clear()

    def cooling_until(self, cluster: str, now: float) -> float | None:
        """When the cluster's cooldown (for everyone) ends, or None when it is not cooling down."""
        s = self.stats.get(cluster)
        if s is None or s.cooldown_until <= now:
            return None
        return s.cooldown_until

    def get(self, cluster: str) -> ClusterStats | None:
        return self.stats.get(cluster)

    def view(self, tenant: str, now: float) -> FeedbackView:
        """The stats one decision for `tenant` at `now` scores with (decayed, tenant-aware)."""
        return FeedbackView(self, tenant, now)

    def _contradicted(self, s: ClusterStats, failing: str, now: float) -> bool:
        """Whether another tenant than `failing` succeeded here within the cooldown window."""
        since = now - self._cooldown.window_s
        return any(t != failing and when >= since for t, when in s.last_ok.items())

    def _evidenced(self, s: ClusterStats, err: float, keep: float) -> float:
        """`err` as far as the evidence carries it: in full after a streak of failures, capped by the
        failure share of enough recent outcomes, else nothing."""
        streak, min_samples = self._evidence
        if s.streak >= streak:
            return err
        outcomes = s.outcomes_w * keep
        if outcomes >= min_samples:
            return min(err, s.failures_w * keep / outcomes)
        return 0.0

    def seen_by(self, s: ClusterStats, tenant: str, now: float) -> ClusterStats:
        keep = self._decay(now - s.updated)
        rates = sorted(((r * self._decay(now - t), name) for name, (r, t) in s.tenant_errors.items()), reverse=True)
        own_rate, own_since = s.tenant_errors.get(tenant, (0.0, now))
        own = own_rate * self._decay(now - own_since)
        shared = 0.0
        if rates:
            worst, worst_tenant = rates[0]
            shared = worst
            if self._contradicted(s, worst_tenant, now):  # the worst tenant's failures are its own affair
                shared = rates[1][0] if len(rates) > 1 else 0.0
        cooldown = max(s.cooldown_until, s.tenant_cooldown.get(tenant, 0.0))
        err = self._evidenced(s, max(own, shared), keep)
        if err < _FORGET_BELOW:
            err = 0.0  # healed: a faded error must not lose ties to an identical deployment for ever
        return ClusterStats(s.latency_s, s.latency_n * keep, s.ttft_s, s.ttft_n * keep, err,
                            s.requests, s.failures, cooldown, now)


class StatsLookup(Protocol):
    """What filters and the score read: a cluster's stats, or None (a dict does, and a view)."""

    def get(self, cluster: str, /) -> ClusterStats | None: ...


class FeedbackView:
    """A read-only mapping cluster -> stats as one tenant's decision sees them now (built lazily)."""

    __slots__ = ("_feedback", "_tenant", "_now", "_seen")

    def __init__(self, feedback: Feedback, tenant: str, now: float) -> None:
        self._feedback = feedback
        self._tenant = tenant
        self._now = now
        self._seen: dict[str, ClusterStats | None] = {}

    def get(self, cluster: str, /) -> ClusterStats | None:
        if cluster in self._seen:
            return self._seen[cluster]
        s = self._feedback.stats.get(cluster)
        out = None if s is None else self._feedback.seen_by(s, self._tenant, self._now)
        self._seen[cluster] = out
        return out
