"""From a request's context to the buckets it must pass: which rule applies, which key it uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from contracts.config.ratelimit import SCOPES, LimitRule, RateLimitConfig, Scope, Unit

from .bucket import NANO, BucketParams

_PLANS_MAX = 4096
# A bucket's scope: a config rule's, or `key` (a store key's own limits, set on the key, not in config).
BucketScope = Scope | Literal["key"]
SECONDS_PER_MINUTE = 60


class KeyLimits(Protocol):
    """A key's own per-minute limits (`contracts.keys.Caller` is one): a bucket per key id and unit."""

    @property
    def key_id(self) -> str | None: ...
    @property
    def rpm(self) -> int | None: ...
    @property
    def tpm(self) -> int | None: ...


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
    scope: BucketScope
    unit: Unit
    params: BucketParams
    cost_nano: int


def rule_label(r: LimitRule) -> str:
    """How the tuner and the decision log name a rule: `scope:match[tier=T]:unit`."""
    tier = f"[tier={r.tier}]" if r.tier else ""
    return f"{r.scope}:{r.match}{tier}:{r.unit}"


def bucket_key(scope: BucketScope, value: str, unit: Unit) -> str:
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
        self._plans: dict[tuple[RequestContext, tuple[Unit, ...]], tuple[tuple[str, BucketScope, Unit, BucketParams], ...]] = {}
        # Per key (id, rpm, tpm): its own buckets, each (key, unit, params).
        self._key_plans: dict[tuple[str, int | None, int | None], tuple[tuple[str, Unit, BucketParams], ...]] = {}

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

    def label_of(self, charge: Charge, ctx: RequestContext) -> str:
        """The label of the rule behind one of `ctx`'s charges ("" when none applies); a key's
        own bucket is its own rule, labelled as its bucket key (`key:<id>:<unit>`)."""
        if charge.scope == "key":
            return charge.key
        value = ctx.value(charge.scope)
        rule = None if value is None else self.rule_for(charge.scope, value, charge.unit, ctx.tier)
        return "" if rule is None else rule_label(rule)

    def charges(self, ctx: RequestContext, costs: dict[Unit, int]) -> list[Charge]:
        key = (ctx, tuple(costs))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(ctx, key[1])
            if len(self._plans) >= _PLANS_MAX:
                self._plans.clear()
            self._plans[key] = plan
        return [Charge(k, scope, unit, params, costs[unit] * NANO) for k, scope, unit, params in plan]

    def key_charges(self, key: KeyLimits | None, costs: dict[Unit, int]) -> list[Charge]:
        """A key's own buckets (capacity the per-minute figure, refilled over a minute); none when
        the key sets no limits. They do not depend on the rules: only the key's figures."""
        if key is None or key.key_id is None:
            return []
        ident = (key.key_id, key.rpm, key.tpm)
        plan = self._key_plans.get(ident)
        if plan is None:
            plan = _key_plan(*ident)
            if len(self._key_plans) >= _PLANS_MAX:
                self._key_plans.clear()
            self._key_plans[ident] = plan
        return [Charge(k, "key", unit, params, costs[unit] * NANO) for k, unit, params in plan if unit in costs]

    def _plan(self, ctx: RequestContext, units: tuple[Unit, ...]) -> tuple[tuple[str, BucketScope, Unit, BucketParams], ...]:
        out = []
        for unit in units:
            if unit not in self.units:
                continue
            for scope in SCOPES:
                c = self.charge(scope, ctx.value(scope), unit, 0, ctx.tier)
                if c is not None:
                    out.append((c.key, c.scope, c.unit, c.params))
        return tuple(out)


def _key_plan(key_id: str, rpm: int | None, tpm: int | None) -> tuple[tuple[str, Unit, BucketParams], ...]:
    limits: tuple[tuple[Unit, int | None], ...] = (("requests", rpm), ("tokens", tpm))
    return tuple((bucket_key("key", key_id, unit), unit, BucketParams.of(n / SECONDS_PER_MINUTE, n))
                 for unit, n in limits if n is not None)
