"""The learning strategy (`routing.adaptive`): a bandit over a model's deployments on one channel.

Pure: times are passed in, randomness comes from the `random.Random` given. Each arm (a deployment,
in the group of a model and channel, or of a tenant's when learning per tenant) keeps decayed
evidence: the reward mass it earned (`wins`) and the mass it missed (`losses`), each call adding
`reward` and `1 - reward`. Its posterior is Beta(1 + wins, 1 + losses).

The choice is Thompson sampling by probability matching: each arm's share is its chance to be the
best arm under the posteriors (estimated with `draws` joint draws, cached for `refresh_s`), mixed with
an exploration floor so no arm ever falls below `floor`. The call then draws an arm from those
shares, so the probability of the chosen arm (its propensity) is known exactly and logged with the
call: `modelyard route replay` weighs logged calls by it (extproc/routing/replay.py).

Forgetting: evidence halves every `half_life_s`, so three failures fade into the prior whatever
traffic the arm gets afterwards; what only time should heal heals (the floor keeps feeding it
evidence meanwhile).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from contracts.config.routing import AdaptiveSettings, RewardWeights

# The metering row's strategy for a call the learning strategy routed (its `arm` is the cluster chosen).
ADAPTIVE = "adaptive"
# A group of arms: (model, channel, tenant or "").
GroupKey = tuple[str, str, str]


@dataclass(slots=True)
class ArmEvidence:
    """Decayed reward mass of one arm, as of `at` (seconds on the caller's clock)."""

    wins: float = 0.0
    losses: float = 0.0
    at: float = 0.0

    def decayed(self, now: float, half_life_s: float) -> tuple[float, float]:
        if now <= self.at:
            return self.wins, self.losses
        f = 0.5 ** ((now - self.at) / half_life_s)
        return self.wins * f, self.losses * f

    def add(self, wins: float, losses: float, now: float, half_life_s: float) -> None:
        w, lo = self.decayed(now, half_life_s)
        self.wins, self.losses, self.at = w + wins, lo + losses, max(now, self.at)

    @property
    def calls(self) -> float:
        return self.wins + self.losses


@dataclass(frozen=True, slots=True)
class Pick:
    """The bandit's choice: the arm, the probability it had (propensity), and every arm's share."""

    arm: str
    propensity: float
    shares: dict[str, float]


def call_reward(weights: RewardWeights, ok: bool, latency_s: float, cost: float, *,
                latency_target_ms: float, cost_target: float) -> float:
    """One call's reward in [0, 1] (feedback comes later, on its own): 0 for a failed call."""
    if not ok:
        return 0.0
    total = weights.success + weights.latency + weights.cost
    if total <= 0:
        return 1.0
    target_s = latency_target_ms / 1000
    latency = target_s / (target_s + max(latency_s, 0.0))
    cheap = cost_target / (cost_target + max(cost, 0.0))
    return (weights.success + weights.latency * latency + weights.cost * cheap) / total


def floored(shares: dict[str, float], floor: float) -> dict[str, float]:
    """Mix the shares with a uniform floor: every arm at least `floor` (at most 1/k of it)."""
    k = len(shares)
    f = min(floor, 1.0 / k)
    return {a: f + (1.0 - k * f) * s for a, s in shares.items()}


def best_arm_shares(posteriors: Sequence[tuple[str, float, float]], draws: int, rng: random.Random) -> dict[str, float]:
    """Each arm's chance to draw the highest value from its Beta(a, b), by `draws` joint draws (NumPy: about
    20x faster than `random.betavariate` in a loop; seeded from `rng`, so a seeded bandit repeats itself)."""
    names = [name for name, _, _ in posteriors]
    a = np.array([p[1] for p in posteriors])
    b = np.array([p[2] for p in posteriors])
    x = np.random.default_rng(rng.getrandbits(63)).beta(a, b, size=(draws, len(names)))
    wins = np.bincount(x.argmax(axis=1), minlength=len(names))
    return {name: float(n) / draws for name, n in zip(names, wins, strict=True)}


@dataclass(slots=True)
class _Cache:
    arms: tuple[str, ...]
    shares: dict[str, float]
    at: float


@dataclass(slots=True)
class Bandit:
    """Every group's arms and their evidence; `choose` on the hot path, `learn` after each call."""

    settings: AdaptiveSettings
    rng: random.Random = field(default_factory=random.Random)
    evidence: dict[GroupKey, dict[str, ArmEvidence]] = field(default_factory=dict)
    # Evidence learned here since the shared store last took it (store: redis); None: not shared.
    pending: dict[tuple[GroupKey, str], ArmEvidence] | None = None
    _cache: dict[GroupKey, _Cache] = field(default_factory=dict)

    def group(self, model: str, channel: str, tenant: str) -> GroupKey:
        return (model, channel, tenant if self.settings.per_tenant else "")

    def learns(self, model: str) -> bool:
        return model in self.settings.models

    def shares(self, key: GroupKey, arms: Sequence[str], now: float) -> dict[str, float]:
        """The arms' shares now (floored), recomputed at most every `refresh_s`."""
        arms_t = tuple(sorted(arms))  # the score may reorder them call to call: one cache entry for the set
        c = self._cache.get(key)
        s = self.settings
        # Cached for refresh_s whatever was learned since (the hot path must not draw per call); decay
        # alone moves the posteriors too, so an unchanged group is recomputed as well.
        if c is not None and c.arms == arms_t and 0.0 <= now - c.at < s.refresh_s:
            return c.shares
        ev = self.evidence.get(key, {})
        posteriors = []
        for a in arms_t:
            e = ev.get(a)
            w, lo = e.decayed(now, s.half_life_s) if e is not None else (0.0, 0.0)
            posteriors.append((a, 1.0 + w, 1.0 + lo))
        raw = best_arm_shares(posteriors, s.draws, self.rng) if len(arms_t) > 1 else {arms_t[0]: 1.0}
        shares = floored(raw, s.floor)
        self._cache[key] = _Cache(arms_t, shares, now)
        return shares

    def choose(self, key: GroupKey, arms: Sequence[str], now: float) -> Pick:
        """Draw one arm from the shares; its share is the propensity the call logs."""
        shares = self.shares(key, arms, now)
        u = self.rng.random()
        acc = 0.0
        ordered = sorted(arms)
        chosen = ordered[-1]
        for a in ordered:
            acc += shares[a]
            if u < acc:
                chosen = a
                break
        return Pick(chosen, shares[chosen], shares)

    def learn(self, key: GroupKey, arm: str, reward: float, now: float, weight: float = 1.0) -> None:
        """Add one outcome: `reward` in [0, 1], counted `weight` times (feedback has its own weight)."""
        r = min(max(reward, 0.0), 1.0)
        ev = self.evidence.setdefault(key, {}).setdefault(arm, ArmEvidence(at=now))
        ev.add(weight * r, weight * (1.0 - r), now, self.settings.half_life_s)
        if self.pending is not None:
            self.pending.setdefault((key, arm), ArmEvidence(at=now)).add(weight * r, weight * (1.0 - r), now,
                                                                         self.settings.half_life_s)

    def take_pending(self, now: float) -> dict[tuple[GroupKey, str], tuple[float, float]]:
        """The evidence learned here since the last call, decayed to `now`, handed to the shared store."""
        if not self.pending:
            return {}
        out = {k: e.decayed(now, self.settings.half_life_s) for k, e in self.pending.items()}
        self.pending.clear()
        return out

    def groups(self) -> dict[GroupKey, set[str]]:
        """Every group this process routes or learned for, with its arms (what a sync reads back)."""
        out: dict[GroupKey, set[str]] = {k: set(c.arms) for k, c in self._cache.items()}
        for k, arms in self.evidence.items():
            out.setdefault(k, set()).update(arms)
        return out

    def merge(self, key: GroupKey, arm: str, wins: float, losses: float, at: float) -> None:
        """Replace an arm's evidence with the shared store's (Redis sync), as of `at`."""
        self.evidence.setdefault(key, {})[arm] = ArmEvidence(wins, losses, at)

    def exposition(self, now: float) -> Iterator[tuple[GroupKey, str, dict[str, float]]]:
        """Every arm's share (the last computed), reward (posterior mean) and evidence (decayed calls)."""
        hl = self.settings.half_life_s
        for key in list(self._cache.keys() | self.evidence.keys()):
            c = self._cache.get(key)
            ev = self.evidence.get(key, {})
            for arm in (c.arms if c is not None else tuple(ev)):
                e = ev.get(arm)
                w, lo = e.decayed(now, hl) if e is not None else (0.0, 0.0)
                share = c.shares.get(arm, 0.0) if c is not None else 0.0
                yield key, arm, {"share": share, "reward": (1.0 + w) / (2.0 + w + lo), "evidence": w + lo}
