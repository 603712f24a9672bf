"""A decision over several buckets, and the OpenAI-style headers that describe it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from .backend import BucketView
from .bucket import NANO, US, reset_us
from .rules import Charge

# Who decided: the in-memory store, Redis, the local fallback while Redis is down, or the
# fail-closed policy refusing everything while it is down.
Store = Literal["memory", "redis", "local", "fail_closed"]

# Buckets that belong to the caller (its key's own, its tenant's, its tier's). Cluster, channel and
# global buckets are shared by every tenant: reporting them would show one tenant the others' traffic.
CALLER_SCOPES = frozenset({"key", "tenant", "tier"})


@dataclass(slots=True)
class Reservation:
    """What an admitted request took from token buckets, to correct once usage is known."""

    store: Store  # reconcile where it was charged
    token_charges: tuple[Charge, ...]
    est_tokens: int
    settled: bool = False


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    retry_after_s: float = 0.0
    reservation: Reservation | None = None
    views: tuple[BucketView, ...] = ()
    # The bucket key that refused (the one with the longest wait), or "" when allowed.
    limited_by: str = ""
    # True when a refused cost exceeds a bucket's burst: waiting will never help.
    too_large: bool = False
    store: Store = "memory"

    def headers(self) -> list[tuple[str, str]]:
        """x-ratelimit-{limit,remaining,reset}-{requests,tokens} of the caller's tightest bucket per
        unit (its key's, tenant's or tier's; none when it has none), and retry-after on a refusal."""
        out: list[tuple[str, str]] = []
        own = tuple(v for v in self.views if v.charge.scope in CALLER_SCOPES)
        for unit in ("requests", "tokens"):
            v = tightest(own, unit)
            if v is None:
                continue
            out.append((f"x-ratelimit-limit-{unit}", str(v.params.burst_nano // NANO)))
            out.append((f"x-ratelimit-remaining-{unit}", str(max(0, v.level_nano) // NANO)))
            out.append((f"x-ratelimit-reset-{unit}", format_duration(reset_us(v.level_nano, v.params) / US)))
        if not self.allowed and not self.too_large:
            out.append(("retry-after", str(max(1, math.ceil(self.retry_after_s)))))
        return out


def tightest(views: tuple[BucketView, ...], unit: str) -> BucketView | None:
    """The bucket of `unit` with the fewest tokens left (then the smallest capacity)."""
    best: BucketView | None = None
    for v in views:
        if v.charge.unit != unit:
            continue
        if best is None or (v.level_nano, v.params.burst_nano) < (best.level_nano, best.params.burst_nano):
            best = v
    return best


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: '250ms', '1s', '1.5s', '6m0s', '1h2m3s'."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    total_ms = math.ceil(seconds * 1000)
    h, rem = divmod(total_ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s = rem / 1000
    s_txt = f"{s:.3f}".rstrip("0").rstrip(".")
    if h:
        return f"{h}h{m}m{s_txt}s"
    if m:
        return f"{m}m{s_txt}s"
    return f"{s_txt}s"


def decide(result_allowed: bool, views: tuple[BucketView, ...], store: Store, est_tokens: int) -> Decision:
    """Fold one store answer into a Decision (pure)."""
    if result_allowed:
        toks = tuple(v.charge for v in views if v.charge.unit == "tokens")
        res = Reservation(store, toks, est_tokens) if toks else None
        return Decision(True, 0.0, res, views, store=store)
    worst: BucketView | None = None
    too_large = False
    for v in views:
        if v.wait_us < 0:
            too_large = True
            worst = v
            break
        if v.wait_us > 0 and (worst is None or v.wait_us > worst.wait_us):
            worst = v
    retry = math.inf if too_large else (worst.wait_us / US if worst else 0.0)
    return Decision(False, retry, None, views, worst.charge.key if worst else "", too_large, store)
