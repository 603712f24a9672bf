"""What a set of limits would have refused of a trace: every request replayed through the
limiter's own pieces (RuleSet charges, the memory store's all-or-nothing take, `decide` naming
the bucket that bound), so tier-wide rules and the global breaker count exactly as they would.

One assumption: a request is charged its actual tokens on arrival (the limiter charges an
estimate and reconciles later), i.e. perfect estimates.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from contracts.config.ratelimit import SCOPES, LimitRule, RateLimitConfig, Unit

from ..backend import MemoryBuckets
from ..decision import decide
from ..rules import Charge, RequestContext, RuleSet
from .traces import FIELDS, Trace


def rule_label(r: LimitRule) -> str:
    tier = f"[tier={r.tier}]" if r.tier else ""
    return f"{r.scope}:{r.match}{tier}:{r.unit}"


@dataclass
class Tally:
    requests: int = 0
    rejected: int = 0
    bound_by: Counter[str] = field(default_factory=Counter)  # rule label -> refusals it bound

    @property
    def share(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0


@dataclass
class WhatIf:
    group_by: str
    total: Tally
    per_key: dict[str, Tally]
    refused: list[bool]  # per trace row


def _plan(rules: RuleSet, ctx: RequestContext) -> list[tuple[Charge, str]]:
    """The buckets a request of this context is charged (unit cost) with their rule labels."""
    out = []
    for unit in ("requests", "tokens"):
        if unit not in rules.units:
            continue
        for scope in SCOPES:
            value = ctx.value(scope)
            if value is None:
                continue
            rule = rules.rule_for(scope, value, unit, ctx.tier)
            c = rules.charge(scope, value, unit, 1, ctx.tier)
            if rule is not None and c is not None:
                out.append((c, rule_label(rule)))
    return out


def simulate(trace: Trace, cfg: RateLimitConfig, group_by: str) -> WhatIf:
    """Replay every row through `cfg`'s buckets (all units, all scopes, one decision per row)."""
    rules = RuleSet(cfg)
    store = MemoryBuckets(clock=lambda: 0)
    plans: dict[tuple[str | None, ...], list[tuple[Charge, str]]] = {}
    labels: dict[str, str] = {}
    cols = [trace.cols[f] for f in FIELDS[:4]]
    groups = trace.cols.get(group_by)
    total, per_key = Tally(), dict[str, Tally]()
    refused = [False] * len(trace)
    cost_of: dict[Unit, list[int]] = {"requests": trace.req_nano, "tokens": trace.tok_nano}
    for i, ts in enumerate(trace.ts_us):
        g = "*" if groups is None else (groups[i] or "(none)")
        tally = per_key.get(g)
        if tally is None:
            tally = per_key[g] = Tally()
        tally.requests += 1
        total.requests += 1
        if not cfg.enabled:
            continue
        ctx_key = (cols[0][i], cols[1][i], cols[2][i], cols[3][i])
        plan = plans.get(ctx_key)
        if plan is None:
            plan = plans[ctx_key] = _plan(rules, RequestContext(*ctx_key))
            labels.update((c.key, lab) for c, lab in plan)
        if not plan:
            continue
        charges = [Charge(c.key, c.scope, c.unit, c.params, cost_of[c.unit][i]) for c, _ in plan]
        res = store.take_now(charges, ts)
        if res.allowed:
            continue
        d = decide(False, res.views, "memory", 0)
        rule = labels.get(d.limited_by, d.limited_by)
        refused[i] = True
        for t in (tally, total):
            t.rejected += 1
            t.bound_by[rule] += 1
    return WhatIf(group_by, total, per_key, refused)


def format_bound(c: Counter[str], top: int = 3) -> str:
    if not c:
        return "-"
    parts = [f"{k} x{n}" for k, n in c.most_common(top)]
    if len(c) > top:
        parts.append(f"+{len(c) - top} more")
    return ", ".join(parts)
