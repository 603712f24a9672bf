"""Spend reports (`modelyard spend`, and the admin API's): the metering rows summed per key,
tenant, model, channel or cluster ("how much dearer is the fast channel?"). `spend_report` is pure; `read_calls` reads one or more metering stores (each
host's workers share one file; replicas on other hosts each have their own)."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

By = Literal["key", "tenant", "model", "channel", "cluster"]
BY: tuple[By, ...] = ("key", "tenant", "model", "channel", "cluster")
_Group = tuple[str | None, str | None, str | None, str | None, str | None]  # key, tenant, model, channel, cluster


@dataclass(frozen=True, slots=True)
class MeteredCall:
    """The columns of a metering `requests` row a report needs."""

    ts: float
    key_id: str | None
    tenant: str | None
    model: str | None
    input_tokens: int
    output_tokens: int
    cost: float
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cache_saved: float = 0.0  # the call at the full input price, minus cost
    channel: str | None = None
    cluster: str | None = None


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One group's totals; the columns not grouped on are None."""

    key_id: str | None
    tenant: str | None
    model: str | None
    requests: int
    tokens: int
    spend_usd: float
    cache_read_tokens: int = 0  # of `tokens`: prompt tokens read from the provider's cache
    cache_write_tokens: int = 0  # of `tokens`: written to it
    saved_usd: float = 0.0  # what the prompt cache saved (writes priced above input count against it)
    channel: str | None = None
    cluster: str | None = None

    def as_dict(self) -> dict[str, object]:
        """The row as JSON; channel and cluster only where it is grouped on them (the other reports' rows
        keep the keys they always had)."""
        out = asdict(self)
        if self.channel is None:
            del out["channel"], out["cluster"]
        return out


def _group(call: MeteredCall, by: By) -> _Group:
    if by == "key":  # a key belongs to one tenant; config-file keys (no id) group per tenant
        return call.key_id, call.tenant, None, None, None
    if by == "tenant":
        return None, call.tenant, None, None, None
    if by == "model":
        return None, None, call.model, None, None
    if by == "channel":
        return None, None, None, call.channel, None
    if by == "cluster":  # a deployment serves one channel: the cluster's row says which
        return None, None, None, call.channel, call.cluster
    raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")


def spend_report(rows: Iterable[MeteredCall], by: By, since: float | None = None) -> list[SpendRow]:
    """Requests, tokens and spend per group, the biggest spender first. Spend is `math.fsum` of
    the rows' costs: the exactly rounded sum, whatever order the rows come in."""
    if by not in BY:
        raise ValueError(f"--by must be one of {', '.join(BY)}, not {by!r}")
    costs: dict[_Group, list[float]] = {}
    saved: dict[_Group, list[float]] = {}
    counts: dict[_Group, list[int]] = {}
    for call in rows:
        if since is not None and call.ts < since:
            continue
        g = _group(call, by)
        costs.setdefault(g, []).append(call.cost or 0.0)
        saved.setdefault(g, []).append(call.cache_saved or 0.0)
        c = counts.setdefault(g, [0, 0, 0, 0])
        c[0] += 1
        c[1] += (call.input_tokens or 0) + (call.output_tokens or 0)
        c[2] += call.cache_read_tokens or 0
        c[3] += call.cache_write_tokens or 0
    out = [SpendRow(g[0], g[1], g[2], counts[g][0], counts[g][1], math.fsum(costs[g]), counts[g][2], counts[g][3],
                    math.fsum(saved[g]), channel=g[3], cluster=g[4]) for g in costs]
    out.sort(key=lambda r: (-r.spend_usd, r.tenant or "", r.key_id or "", r.model or "", r.cluster or "",
                            r.channel or ""))
    return out


def read_calls(paths: Iterable[str | Path], since: float | None = None) -> Iterator[MeteredCall]:
    """Every metered call in the given metering stores (from `since` on), read-only. A store from
    before key ids (or prompt-cache counts) were metered reads as calls with none."""
    for path in paths:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"no metering database at {p}")
        conn = sqlite3.connect(f"file:{p}?mode=ro", uri=True)
        try:
            cols = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
            if not cols:
                continue
            key = "key_id" if "key_id" in cols else "NULL"
            cache = ", ".join(c if c in cols else "0" for c in ("cache_read_tokens", "cache_write_tokens", "cache_saved"))
            routed = ", ".join(c if c in cols else "NULL" for c in ("channel", "cluster"))
            q = f"SELECT ts, {key}, tenant, model, input_tokens, output_tokens, cost, {cache}, {routed} FROM requests"
            args: tuple[float, ...] = ()
            if since is not None:
                q += " WHERE ts >= ?"
                args = (since,)
            for ts, key_id, tenant, model, tin, tout, cost, read, write, saved, channel, cluster in conn.execute(q, args):
                yield MeteredCall(ts, key_id, tenant, model, int(tin or 0), int(tout or 0), float(cost or 0.0),
                                  int(read or 0), int(write or 0), float(saved or 0.0), channel, cluster)
        finally:
            conn.close()


def render_table(rows: list[SpendRow]) -> str:
    """A plain text table, one group a line ('-' where a column is not grouped on); channel and
    cluster columns only when a row is grouped on them, so the other reports read as before."""
    routed = any(r.channel is not None for r in rows)
    names = ("channel", "cluster") if routed else ()
    head = ("key_id", "tenant", "model", *names, "requests", "tokens", "cache_read", "cache_write", "spend_usd",
            "cache_saved_usd")
    cells = [head] + [(r.key_id or "-", r.tenant or "-", r.model or "-",
                       *((r.channel or "-", r.cluster or "-") if routed else ()), str(r.requests), str(r.tokens),
                       str(r.cache_read_tokens), str(r.cache_write_tokens), f"{r.spend_usd:.6f}",
                       f"{r.saved_usd:.6f}") for r in rows]
    labels = 3 + len(names)
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    lines = ["  ".join(c[i].ljust(widths[i]) if i < labels else c[i].rjust(widths[i]) for i in range(len(head)))
             for c in cells]
    return "\n".join(lines) + "\n"
