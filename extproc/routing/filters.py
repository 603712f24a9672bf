"""The checks that drop deployments, each a small function returning a `Rejection` or None.

Tenant access resolves the requested name to the models a tenant may use. Static checks depend
only on the request's shape (cached by the scheduler); runtime checks read the prompt size, the
live feedback and the watermark readings of this moment.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

from contracts.config import TenantConfig
from contracts.config.routing import TierAdmission
from contracts.config.service_levels import Tier
from contracts.watermarks import Reading
from extproc.routing.admission import tier_allows
from extproc.routing.breaker import Breakers
from extproc.routing.decision import Rejection, RouteRequest
from extproc.routing.errors import ModelNotFound
from extproc.routing.feedback import StatsLookup
from extproc.routing.index import Entry
from extproc.routing.share_breaker import ShareBreakers

# -- tenant access --------------------------------------------------------------------------


def allowed_members(
    model: str, tenant: TenantConfig, models: Container[str], groups: Mapping[str, tuple[str, ...]]
) -> tuple[str, ...]:
    """The models `tenant` may reach under `model` (a model or a group name), or ModelNotFound:
    unknown and forbidden read the same, so tenants cannot probe."""
    not_found = ModelNotFound(f"model {model!r} not found")
    if model in models:
        if not tenant.may_use(model):
            raise not_found
        return (model,)
    members = groups.get(model)
    if members is None:
        raise not_found
    if tenant.may_use(model):
        # Granting a group grants its members.
        return members
    allowed = tuple(m for m in members if tenant.may_use(m))
    if not allowed:
        raise not_found
    return allowed


# -- static: the request's shape --------------------------------------------------------------


def task_type(e: Entry, req: RouteRequest) -> Rejection | None:
    # A text completion goes to a model that serves them, or to a chat model as one user turn.
    if req.task_type in e.task_types or (req.task_type == "completion" and "chat" in e.task_types):
        return None
    return Rejection(e.name, e.cluster, f"task type {req.task_type!r} not supported", "task_type")


def tools(e: Entry, req: RouteRequest) -> Rejection | None:
    if not req.needs_tools or e.tools:
        return None
    return Rejection(e.name, e.cluster, "tools not supported", "tools")


def vision(e: Entry, req: RouteRequest) -> Rejection | None:
    if not req.needs_vision or e.vision:
        return None
    return Rejection(e.name, e.cluster, "images not supported", "vision")


def streaming(e: Entry, req: RouteRequest) -> Rejection | None:
    if not req.stream or e.streaming:
        return None
    return Rejection(e.name, e.cluster, "streaming not supported", "streaming")


def channel(e: Entry, req: RouteRequest) -> Rejection | None:
    # A fast-only model's deployments also carry standard traffic.
    if not e.fast or req.want_fast or e.fast_only_model:
        return None
    return Rejection(e.name, e.cluster, "fast channel not requested", "channel")


STATIC_CHECKS = (task_type, tools, vision, streaming, channel)


def static_rejection(e: Entry, req: RouteRequest) -> Rejection | None:
    """The first static check `e` fails for this request, in a fixed order."""
    for check in STATIC_CHECKS:
        rejection = check(e, req)
        if rejection is not None:
            return rejection
    return None


# -- runtime: this request, this moment --------------------------------------------------------
# Each check is one pass over the survivors of the previous one (a call per decision, not per
# deployment: a decision over a thousand deployments stays cheap). Failures go to `rejected` with
# their entry, so the scheduler can list them in config order.

Rejected = list[tuple[Entry, Rejection]]


def reserved(entries: list[Entry], tenant: TenantConfig, rejected: Rejected) -> list[Entry]:
    """Dedicated pools: a deployment reserved for some tiers or tenants serves nobody else."""
    out = [e for e in entries if e.reserved_for is None or e.reserved_for.admits(tenant.name, tenant.tier)]
    if len(out) < len(entries):
        for e in entries:
            if e.reserved_for is not None and not e.reserved_for.admits(tenant.name, tenant.tier):
                rejected.append((e, Rejection(e.name, e.cluster, "reserved for other tiers or tenants", "reserved")))
    return out


def context_window(entries: list[Entry], prompt_tokens: int, rejected: Rejected) -> list[Entry]:
    out = [e for e in entries if not prompt_tokens > e.context_window]
    if len(out) < len(entries):
        for e in entries:
            if prompt_tokens > e.context_window:
                why = f"prompt ~{prompt_tokens} tokens exceeds context window {e.context_window}"
                rejected.append((e, Rejection(e.name, e.cluster, why, "context_window")))
    return out


def max_output(entries: list[Entry], asked: int | None, rejected: Rejected) -> list[Entry]:
    """Deployments of models that cannot give the output tokens the call asks for (max_tokens and
    its kin): the upstream would refuse the call or cut the answer short."""
    if asked is None:
        return entries
    out = [e for e in entries if asked <= e.max_output_tokens]
    if len(out) < len(entries):
        for e in entries:
            if asked > e.max_output_tokens:
                why = f"asks {asked} output tokens, over max_output_tokens {e.max_output_tokens}"
                rejected.append((e, Rejection(e.name, e.cluster, why, "max_output_tokens")))
    return out


def breaker(entries: list[Entry], breakers: Breakers, now: float, rejected: Rejected) -> list[Entry]:
    """Deployments whose group breaker is open (or half-open with its probes out) stay out."""
    out = []
    for e in entries:
        b = breakers.blocking(e.name, e.cluster, now)
        if b is None:
            out.append(e)
        else:
            why = (f"group breaker {b.group} open ({b.retry_after(now):.1f}s left)" if b.state == "open"
                   else f"group breaker {b.group} half-open (probes out)")
            rejected.append((e, Rejection(e.name, e.cluster, why, "breaker")))
    return out


def share(admitted: list[tuple[Entry, float, bool]], shares: ShareBreakers, now: float,
          rejected: Rejected) -> list[tuple[Entry, float, bool]]:
    """Deployments of a member a share breaker tripped stay out, unless no other member can take the call."""
    kept = []
    skipped: Rejected = []
    for a in admitted:
        e = a[0]
        b = shares.skipping(e.name, now)
        if b is None:
            kept.append(a)
        else:
            skipped.append((e, Rejection(e.name, e.cluster, b.reason(e.name, now), "share")))
    if not kept:
        return admitted  # the breaker moves load; it never refuses a call
    rejected += skipped
    return kept


def cooldown(entries: list[Entry], stats: StatsLookup, now: float, rejected: Rejected) -> list[Entry]:
    out = []
    for e in entries:
        st = stats.get(e.cluster)
        if st is not None and st.cooldown_until > now:
            why = f"cooling down ({st.cooldown_until - now:.1f}s left)"
            rejected.append((e, Rejection(e.name, e.cluster, why, "cooldown")))
        else:
            out.append(e)
    return out


def warming(entries: list[Entry], warming_clusters: Container[str], rejected: Rejected) -> list[Entry]:
    out = [e for e in entries if e.cluster not in warming_clusters]
    if len(out) < len(entries):
        for e in entries:
            if e.cluster in warming_clusters:
                rejected.append((e, Rejection(e.name, e.cluster, "warming up", "warming")))
    return out


def missing_reading(
    entries: list[Entry], watermarks: Mapping[str, Reading], rejected: Rejected
) -> list[tuple[Entry, Reading | None]]:
    """Monitored entries with their reading; unmonitored ones (hosted APIs) with None."""
    pairs = [(e, watermarks.get(e.cluster) if e.monitored else None) for e in entries]
    out = [(e, r) for e, r in pairs if r is not None or not e.monitored]
    if len(out) < len(pairs):
        for e, r in pairs:
            if r is None and e.monitored:
                rejected.append((e, Rejection(e.name, e.cluster, "no watermark reading", "no_reading")))
    return out


def stale_reading(
    pairs: list[tuple[Entry, Reading | None]], now: float, stale_after_s: float, rejected: Rejected
) -> list[tuple[Entry, Reading | None]]:
    # An old reading may hide a saturated GPU, so it counts as one.
    out = [(e, r) for e, r in pairs if not (r is not None and now - r.ts > stale_after_s)]
    if len(out) < len(pairs):
        for e, r in pairs:
            if r is not None and now - r.ts > stale_after_s:
                why = f"stale watermark ({now - r.ts:.1f}s old)"
                rejected.append((e, Rejection(e.name, e.cluster, why, "stale_reading")))
    return out


def saturated(
    pairs: list[tuple[Entry, Reading | None]], threshold: float, unmonitored: float, rejected: Rejected
) -> list[tuple[Entry, float]]:
    """Entries below the saturation threshold with their watermark (`unmonitored` for hosted APIs)."""
    out = [
        (e, unmonitored if r is None else r.watermark)
        for e, r in pairs
        if r is None or not (r.saturated or r.watermark >= threshold)
    ]
    if len(out) < len(pairs):
        for e, r in pairs:
            if r is not None and (r.saturated or r.watermark >= threshold):
                why = f"saturated (watermark {r.watermark:.2f})"
                rejected.append((e, Rejection(e.name, e.cluster, why, "saturated")))
    return out


def with_occupancy(loads: list[tuple[Entry, float]], occupancy: Mapping[str, float]) -> list[tuple[Entry, float]]:
    """A deployment's load is the higher of its GPU watermark and its slot occupancy (max_inflight)."""
    if not occupancy:
        return loads
    return [(e, max(wm, min(1.0, occupancy.get(e.cluster, 0.0)))) for e, wm in loads]


def with_latency(loads: list[tuple[Entry, float]], slow: Mapping[str, tuple[float, str]]) -> list[tuple[Entry, float]]:
    """A deployment over its latency objective counts as loaded at its `slo.load`, as a GPU watermark
    that high would (the higher of the two counts)."""
    return [(e, max(wm, slow[e.cluster][0])) if e.cluster in slow else (e, wm) for e, wm in loads]


def fast_admission(
    loads: list[tuple[Entry, float]], quota_left: bool, rule: TierAdmission, tier: Tier, rejected: Rejected,
    slow: Mapping[str, tuple[float, str]] | None = None,
) -> list[tuple[Entry, float, bool]]:
    """For a request that asked for fast: whether each fast deployment admits it as fast use.
    A fast-only model's deployment that does not still serves it, as standard use. `slow`: the
    deployments over their latency objective, and why (the reason names it)."""
    out = []
    for e, wm in loads:
        if not e.fast:
            out.append((e, wm, False))
            continue
        if not quota_left:
            rejection = Rejection(e.name, e.cluster, "fast trial quota used", "fast_quota")
        elif not tier_allows(rule, wm):
            why = f"fast channel closed to {tier} at watermark {wm:.2f}"
            if slow and e.cluster in slow:
                why += f" ({slow[e.cluster][1]})"
            rejection = Rejection(e.name, e.cluster, why, "fast_tier")
        else:
            out.append((e, wm, True))
            continue
        if e.fast_only_model:
            out.append((e, wm, False))
        else:
            rejected.append((e, rejection))
    return out
