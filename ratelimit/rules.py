"""From a request's context to the buckets it must pass: which rule applies, which key it uses."""

from __future__ import annotations

from dataclasses import dataclass

from contracts.config.ratelimit import SCOPES, LimitRule, RateLimitConfig, Scope, Unit

from .bucket import NANO, BucketParams

_PLANS_MAX = 4096


@dataclass(frozen=True, slots=True)
class RequestContext:
    """Who asks and where it goes; a None field skips that scope's buckets."""

    tenant: str | None = None
    tier: str | None = None
    cluster: str | None = None
    channel: str | None = None

    def value(self, scope: Scope) -> str | None:
        return "*" if scope == "global" else getattr(self, scope)


@dataclass(frozen=True, slots=True)
class Charge:
    """One bucket of one decision: its key, its parameters, what this request costs it."""

    key: str
    scope: Scope
    unit: Unit
    params: BucketParams
    cost_nano: int


def bucket_key(scope: Scope, value: str, unit: Unit) -> str:
    # ':' separates fields; values keep their text, so escape the separator and brace (hash tags).
    safe = value.replace("%", "%25").replace(":", "%3A").replace("{", "%7B").replace("}", "%7D")
    return f"{scope}:{safe}:{unit}"


class RuleSet:
    """Rules indexed by (scope, unit). Most specific wins: an exact `match`, then (tenant scope)
    a `*` rule for the tenant's tier, then `*`; a `*` rule gives each value its own bucket."""

    def __init__(self, cfg: RateLimitConfig) -> None:
        self._exact: dict[tuple[str, str, str], LimitRule] = {}
        self._wild: dict[tuple[str, str], LimitRule] = {}
        self._tenant_by_tier: dict[tuple[str, str], LimitRule] = {}
        for r in cfg.limits:
            if r.tier is not None:
                self._tenant_by_tier[(r.tier, r.unit)] = r
            elif r.match == "*":
                self._wild[(r.scope, r.unit)] = r
            else:
                self._exact[(r.scope, r.match, r.unit)] = r
        self.units: frozenset[str] = frozenset(r.unit for r in cfg.limits)
        # Per (context, units): the buckets that apply, each (key, scope, unit, params). The rules
        # are fixed for this object's life (a reload builds a new RuleSet), so only costs vary.
        self._plans: dict[tuple[RequestContext, tuple[Unit, ...]], tuple[tuple[str, Scope, Unit, BucketParams], ...]] = {}

    def rule_for(self, scope: Scope, value: str, unit: Unit, tier: str | None = None) -> LimitRule | None:
        r = self._exact.get((scope, value, unit))
        if r is None and tier is not None and scope == "tenant":
            r = self._tenant_by_tier.get((tier, unit))
        return r or self._wild.get((scope, unit))

    def charge(
        self, scope: Scope, value: str | None, unit: Unit, cost: int, tier: str | None = None
    ) -> Charge | None:
        if value is None:
            return None
        rule = self.rule_for(scope, value, unit, tier)
        if rule is None:
            return None
        return Charge(
            bucket_key(scope, value, unit), scope, unit, BucketParams.of(rule.rate, rule.burst), cost * NANO
        )

    def charges(self, ctx: RequestContext, costs: dict[Unit, int]) -> list[Charge]:
        key = (ctx, tuple(costs))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(ctx, key[1])
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[key] = plan
        return [Charge(k, scope, unit, params, costs[unit] * NANO) for k, scope, unit, params in plan]

    def _plan(self, ctx: RequestContext, units: tuple[Unit, ...]) -> tuple[tuple[str, Scope, Unit, BucketParams], ...]:
        out = []
        for unit in units:
            if unit not in self.units:
                continue
            for scope in SCOPES:
                c = self.charge(scope, ctx.value(scope), unit, 0, ctx.tier)
                if c is not None:
                    out.append((c.key, c.scope, c.unit, c.params))
        return tuple(out)
