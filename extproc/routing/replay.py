"""Offline replay (`modelyard route replay`): what a candidate strategy would have earned on the
calls the learning strategy logged, before an operator turns it on.

Every call the bandit routed is metered with the arm it chose and that arm's probability (the
propensity, `requests.propensity`). For a candidate policy pi that gives each arm a probability,
inverse propensity scoring weighs each logged reward by w = pi(logged arm) / propensity:

- IPS: mean(w * r), unbiased while every arm pi may choose had a logged probability above zero
  (the exploration floor is what guarantees it); its 95% interval is the normal one of the mean.
- SNIPS (self-normalised): sum(w * r) / sum(w), lower variance, slightly biased; its interval by the
  delta method: se^2 = sum(w^2 (r - snips)^2) / sum(w)^2.

Candidates: `uniform` (every arm alike), `fixed:<cluster>` (always that deployment), `adaptive`
(the configured bandit, or `adaptive:half_life_s=10,floor=0.1` with settings changed). A learning
candidate learns from every logged call in time order, so it sees more evidence than it would have
alone: read its figure as optimistic. The arms of a group are those the log shows for it; a call
logged with propensity 1 had one arm left (the rest filtered), and counts as one any candidate routes
the same way.

Pure: `replay` takes calls and returns estimates; `read_logged_calls` is the one reader.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from contracts.config.routing import AdaptiveSettings
from extproc.routing.bandit import ADAPTIVE, Bandit, call_reward

Z95 = 1.959964


@dataclass(frozen=True, slots=True)
class LoggedCall:
    ts: float
    model: str
    channel: str
    tenant: str
    arm: str  # the deployment the bandit chose
    cluster: str  # the deployment that answered (another one after a failover)
    status: int
    latency_ms: float
    cost: float
    propensity: float
    score: float | None = None  # mean feedback, if the caller scored the call


def logged_reward(call: LoggedCall, s: AdaptiveSettings) -> float:
    """The reward the bandit counted for this call (its feedback included, with its weight)."""
    ok = call.status < 500 and call.cluster == call.arm  # a failover is the chosen arm's failure
    r = call_reward(s.reward, ok, call.latency_ms / 1000, call.cost, latency_target_ms=s.latency_target_ms,
                    cost_target=s.cost_target)
    w = s.reward
    base = w.success + w.latency + w.cost
    if call.score is None or w.feedback <= 0 or base <= 0:
        return r
    return (r * base + w.feedback * call.score) / (base + w.feedback)


class Candidate(Protocol):
    name: str

    def probabilities(self, group: tuple[str, str, str], arms: Sequence[str], now: float) -> dict[str, float]: ...
    def observe(self, group: tuple[str, str, str], arm: str, reward: float, now: float) -> None: ...


@dataclass
class Uniform:
    name: str = "uniform"

    def probabilities(self, group: tuple[str, str, str], arms: Sequence[str], now: float) -> dict[str, float]:
        return {a: 1.0 / len(arms) for a in arms}

    def observe(self, group: tuple[str, str, str], arm: str, reward: float, now: float) -> None:
        pass


@dataclass
class Fixed:
    arm: str
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"fixed:{self.arm}"

    def probabilities(self, group: tuple[str, str, str], arms: Sequence[str], now: float) -> dict[str, float]:
        return {a: 1.0 if a == self.arm else 0.0 for a in arms}

    def observe(self, group: tuple[str, str, str], arm: str, reward: float, now: float) -> None:
        pass


@dataclass
class Adaptive:
    settings: AdaptiveSettings
    name: str = ADAPTIVE
    seed: int = 0
    bandit: Bandit = field(init=False)

    def __post_init__(self) -> None:
        self.bandit = Bandit(self.settings, random.Random(self.seed))

    def probabilities(self, group: tuple[str, str, str], arms: Sequence[str], now: float) -> dict[str, float]:
        return self.bandit.shares(group, arms, now)

    def observe(self, group: tuple[str, str, str], arm: str, reward: float, now: float) -> None:
        self.bandit.learn(group, arm, reward, now)


def candidate(spec: str, settings: AdaptiveSettings) -> Candidate:
    """`uniform`, `fixed:<cluster>`, `adaptive` or `adaptive:key=value,...` (AdaptiveSettings keys)."""
    if spec == "uniform":
        return Uniform()
    if spec.startswith("fixed:") and len(spec) > 6:
        return Fixed(spec[6:])
    if spec == ADAPTIVE or spec.startswith(ADAPTIVE + ":"):
        changes: dict[str, object] = {}
        for part in filter(None, spec[len(ADAPTIVE) + 1:].split(",")):
            key, eq, value = part.partition("=")
            if not eq or key not in AdaptiveSettings.model_fields or key in ("models", "reward", "store"):
                raise ValueError(f"adaptive: unknown setting {part!r} (e.g. adaptive:half_life_s=10,floor=0.1)")
            changes[key] = float(value)
        tuned = AdaptiveSettings.model_validate({**settings.model_dump(), **changes})
        return Adaptive(tuned, name=spec)
    raise ValueError(f"unknown strategy {spec!r} (uniform, fixed:<cluster>, adaptive[:key=value,...])")


@dataclass(frozen=True, slots=True)
class Estimate:
    value: float | None
    low: float | None
    high: float | None

    def as_dict(self) -> dict[str, float | None]:
        return {"value": self.value, "low": self.low, "high": self.high}


@dataclass(frozen=True, slots=True)
class GroupReplay:
    model: str
    channel: str
    strategy: str
    calls: int
    logged: Estimate  # the reward the logged policy earned (plain mean)
    ips: Estimate
    snips: Estimate
    effective_calls: float  # (sum w)^2 / sum w^2: how many calls the estimate is worth
    logged_share: dict[str, float]  # per arm: share of the logged calls
    candidate_share: dict[str, float]  # per arm: the candidate's mean probability over them

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "channel": self.channel, "strategy": self.strategy, "calls": self.calls,
                "logged": self.logged.as_dict(), "ips": self.ips.as_dict(), "snips": self.snips.as_dict(),
                "effective_calls": self.effective_calls, "logged_share": self.logged_share,
                "candidate_share": self.candidate_share}


def _mean_interval(values: Sequence[float]) -> Estimate:
    n = len(values)
    if n == 0:
        return Estimate(None, None, None)
    m = sum(values) / n
    if n < 2:
        return Estimate(m, None, None)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    h = Z95 * sd / math.sqrt(n)
    return Estimate(m, m - h, m + h)


def replay(calls: Iterable[LoggedCall], strategy: Candidate, settings: AdaptiveSettings) -> list[GroupReplay]:
    """Each (model, channel) group's estimates for `strategy`, over `calls` in time order."""
    by_group: dict[tuple[str, str], list[LoggedCall]] = {}
    for c in sorted(calls, key=lambda c: c.ts):
        by_group.setdefault((c.model, c.channel), []).append(c)
    out = []
    for (model, channel), group_calls in sorted(by_group.items()):
        arms = sorted({c.arm for c in group_calls})
        rewards, weights, share = [], [], dict.fromkeys(arms, 0.0)
        for c in group_calls:
            key = (model, channel, c.tenant if settings.per_tenant else "")
            # A propensity of 1: only that arm could serve then (the others cooling down, filtered): any
            # strategy would have routed it there too.
            probs = {c.arm: 1.0} if c.propensity >= 1.0 else strategy.probabilities(key, arms, c.ts)
            r = logged_reward(c, settings)
            rewards.append(r)
            weights.append(probs.get(c.arm, 0.0) / max(c.propensity, 1e-9))
            for a in arms:
                share[a] += probs.get(a, 0.0)
            strategy.observe(key, c.arm, r, c.ts)
        n = len(group_calls)
        wr = [w * r for w, r in zip(weights, rewards, strict=True)]
        sw, sw2 = sum(weights), sum(w * w for w in weights)
        if sw > 0:
            sn = sum(wr) / sw
            se = math.sqrt(sum(w * w * (r - sn) ** 2 for w, r in zip(weights, rewards, strict=True))) / sw
            snips = Estimate(sn, sn - Z95 * se, sn + Z95 * se)
        else:
            snips = Estimate(None, None, None)
        out.append(GroupReplay(
            model, channel, strategy.name, n, _mean_interval(rewards), _mean_interval(wr), snips,
            (sw * sw / sw2) if sw2 > 0 else 0.0,
            {a: sum(c.arm == a for c in group_calls) / n for a in arms}, {a: share[a] / n for a in arms}))
    return out


def read_logged_calls(paths: Iterable[str | Path], since: float | None = None,
                      until: float | None = None) -> Iterator[LoggedCall]:
    """Every call the learning strategy routed (with its propensity), its feedback averaged, read-only."""
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no metering store at {p}")
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            cols = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
            if "propensity" not in cols:
                continue  # a store from before the learning strategy: nothing logged
            has_feedback = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'feedback'").fetchone() is not None
            score = "(SELECT AVG(f.score) FROM feedback f WHERE f.task_id = r.task_id)" if has_feedback else "NULL"
            q = (f"SELECT r.ts, r.model, r.channel, r.tenant, r.arm, r.cluster, r.status, r.latency_ms, r.cost, "
                 f"r.propensity, {score} FROM requests r WHERE r.strategy = ? AND r.propensity IS NOT NULL "
                 "AND r.ts >= ? AND r.ts < ? ORDER BY r.ts")
            args = (ADAPTIVE, since if since is not None else 0.0, until if until is not None else math.inf)
            for ts, model, channel, tenant, arm, cluster, status, latency, cost, prop, s in conn.execute(q, args):
                yield LoggedCall(float(ts), model or "", channel or "", tenant or "", arm or "", cluster or "",
                                 int(status or 0), float(latency or 0.0), float(cost or 0.0), float(prop),
                                 None if s is None else float(s))
        finally:
            conn.close()


def render_table(results: Sequence[GroupReplay]) -> str:
    if not results:
        return "no calls routed by the learning strategy in this period (routing.adaptive; see docs/routing.md)\n"
    lines = []
    for g in results:
        lines.append(f"{g.model} ({g.channel}): {g.calls} calls, strategy {g.strategy}")
        lines.append(f"  logged reward {_fmt(g.logged)}")
        lines.append(f"  IPS            {_fmt(g.ips)}")
        lines.append(f"  SNIPS          {_fmt(g.snips)}   effective calls {g.effective_calls:.0f}")
        for arm in g.logged_share:
            lines.append(f"  {arm:<24} logged share {g.logged_share[arm]:.2f} -> candidate {g.candidate_share[arm]:.2f}")
    return "\n".join(lines) + "\n"


def _fmt(e: Estimate) -> str:
    if e.value is None:
        return "-"
    if e.low is None or e.high is None:
        return f"{e.value:.3f}"
    return f"{e.value:.3f} [{e.low:.3f}, {e.high:.3f}]"
