"""Live feedback per cluster: EWMAs of latency, time to first token and error rate, and cooldowns.

State changes only through `record`; reads take `now` explicitly, so tests drive time by hand.
All times are seconds on the caller's monotonic clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from contracts.config.routing import CooldownSettings, FeedbackSettings


@dataclass(slots=True)
class ClusterStats:
    latency_s: float = 0.0
    latency_n: int = 0
    ttft_s: float = 0.0
    ttft_n: int = 0
    error_rate: float = 0.0
    requests: int = 0
    failures: deque[float] = field(default_factory=deque)
    cooldown_until: float = 0.0


class Feedback:
    def __init__(self, feedback: FeedbackSettings, cooldown: CooldownSettings) -> None:
        self._alpha = feedback.alpha
        self._cooldown = cooldown
        self.stats: dict[str, ClusterStats] = {}

    def record(
        self, cluster: str, latency_s: float, ok: bool, ttft_s: float | None = None, *, now: float
    ) -> None:
        s = self.stats.get(cluster)
        if s is None:
            s = self.stats[cluster] = ClusterStats()
        a = self._alpha
        s.requests += 1
        s.error_rate = a * (0.0 if ok else 1.0) + (1 - a) * s.error_rate
        if ok:
            # Failed attempts' latency says little about serving time, so only successes count.
            s.latency_s = latency_s if s.latency_n == 0 else a * latency_s + (1 - a) * s.latency_s
            s.latency_n += 1
            if ttft_s is not None:
                s.ttft_s = ttft_s if s.ttft_n == 0 else a * ttft_s + (1 - a) * s.ttft_s
                s.ttft_n += 1
            s.failures.clear()
            return
        c = self._cooldown
        s.failures.append(now)
        while s.failures and s.failures[0] <= now - c.window_s:
            s.failures.popleft()
        if len(s.failures) >= c.failures:
            s.cooldown_until = now + c.cooldown_s
            # After the cooldown the cluster gets a fresh count, so one more failure does not
            # send it straight back.
            s.failures.clear()

    def cooling_until(self, cluster: str, now: float) -> float | None:
        """When the cluster's cooldown ends, or None when it is not cooling down."""
        s = self.stats.get(cluster)
        if s is None or s.cooldown_until <= now:
            return None
        return s.cooldown_until

    def get(self, cluster: str) -> ClusterStats | None:
        return self.stats.get(cluster)
