"""The Spend page, pure: `modelyard spend` rows for a period and a grouping, as a table and a bar
chart, the prompt cache's savings, and each budget's use against its cap."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from budgets.report import BY, SpendRow
from console.html import ROOT, Safe, bar_chart, join, notice, select, table, tag

PERIODS = (("1h", "last hour"), ("24h", "last 24 hours"), ("7d", "last 7 days"), ("30d", "last 30 days"),
           ("", "all recorded"))


@dataclass(frozen=True, slots=True)
class BudgetUse:
    scope: str  # "key key_…" or "tenant demo"
    period: str
    spent_usd: float
    cap_usd: float
    resets: str  # ISO time

    @property
    def share(self) -> float:
        return self.spent_usd / self.cap_usd if self.cap_usd > 0 else 1.0


def group_of(row: SpendRow, by: str) -> str:
    value = {"key": row.key_id, "tenant": row.tenant, "model": row.model, "channel": row.channel,
             "cluster": row.cluster}.get(by)
    return value if value else "(config-file key)" if by == "key" else "-"


def render(rows: Sequence[SpendRow], *, by: str, since: str, budgets: Sequence[BudgetUse],
           error: str | None = None) -> Safe:
    choose = tag("form", [
        select("period", "since", PERIODS, since),
        select("by", "by", list(BY), by),
        Safe('<button type="submit">Show</button>'),
    ], method="get", action=f"{ROOT}/spend", id="spend-filter")
    total = sum(r.spend_usd for r in rows)
    saved = sum(r.saved_usd for r in rows)
    summary = tag("p", [f"{sum(r.requests for r in rows):,} requests, {sum(r.tokens for r in rows):,} tokens, "
                        f"${total:.6f} spent; the prompt cache saved ${saved:.6f} "
                        f"({sum(r.cache_read_tokens for r in rows):,} tokens read from it)."], id="spend-summary")
    chart = bar_chart([(group_of(r, by), r.spend_usd) for r in rows[:20]], unit=" USD", id_="spend-chart")
    body = [(group_of(r, by), r.requests, f"{r.tokens:,}", f"{r.spend_usd:.6f}", f"{r.cache_read_tokens:,}",
             f"{r.cache_write_tokens:,}", f"{r.saved_usd:.6f}") for r in rows]
    budget_rows = [(b.scope, b.period, f"{b.spent_usd:.6f}", f"{b.cap_usd:.2f}",
                    tag("span", f"{b.share:.0%}", class_="bad" if b.share >= 1 else "ok"), b.resets) for b in budgets]
    return join([
        choose, notice(error, "bad"), summary, chart,
        table([by, "requests", "tokens", "spend USD", "cache read tokens", "cache write tokens", "saved USD"], body,
              id_="spend", empty="no metered calls in this period"),
        tag("h2", "Budgets against their caps (this period)"),
        bar_chart([(b.scope, round(100 * b.share, 1)) for b in budgets], unit=" %", id_="budget-chart"),
        table(["scope", "period", "spent USD", "cap USD", "used", "resets"], budget_rows, id_="budgets",
              empty="no key or tenant has a budget"),
    ])


def budget_uses(keys: Sequence[Mapping[str, object]], tenant_caps: Mapping[str, tuple[float, str]],
                spent: Mapping[tuple[str, str, str], float], resets: Mapping[str, str]) -> list[BudgetUse]:
    """Each budgeted active key and tenant: its spend in its current period against its cap. `spent` is
    keyed (by, name, period): "key"/"tenant", the key id or tenant, the period whose window it sums;
    `resets` is each period's end."""
    out = []
    for k in keys:
        cap = k.get("budget_usd")
        if cap is None or k.get("status") != "active":
            continue
        period = str(k.get("budget_period") or "month")
        out.append(BudgetUse(f"key {k['id']}", period, spent.get(("key", str(k["id"]), period), 0.0),
                             float(str(cap)), resets[period]))
    for tenant, (cap_usd, period) in sorted(tenant_caps.items()):
        out.append(BudgetUse(f"tenant {tenant}", period, spent.get(("tenant", tenant, period), 0.0), cap_usd,
                             resets[period]))
    return out
