"""Tiered admission to the fast channel: a tier may use it below a watermark, L3 only as a
limited trial (at most K fast requests per tenant per sliding minute)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from contracts.config.routing import TierAdmission
from contracts.config.service_levels import Tier

TRIAL_WINDOW_S = 60.0


def tier_allows(rule: TierAdmission, watermark: float) -> bool:
    """Whether a tier may use a fast deployment at this watermark (strictly below the limit)."""
    return rule.max_watermark is None or watermark < rule.max_watermark


class FastAdmission:
    def __init__(self, tiers: Mapping[Tier, TierAdmission]) -> None:
        self.tiers = dict(tiers)
        self._used: dict[str, deque[float]] = {}

    def rule(self, tier: Tier) -> TierAdmission:
        return self.tiers.get(tier) or TierAdmission(max_watermark=0.0)

    def quota_left(self, tenant: str, tier: Tier, now: float) -> bool:
        limit = self.rule(tier).trial_per_minute
        if limit is None:
            return True
        q = self._used.get(tenant)
        if q is None:
            return limit > 0
        while q and q[0] <= now - TRIAL_WINDOW_S:
            q.popleft()
        return len(q) < limit

    def consume(self, tenant: str, tier: Tier, now: float) -> None:
        if self.rule(tier).trial_per_minute is None:
            return
        self._used.setdefault(tenant, deque()).append(now)
