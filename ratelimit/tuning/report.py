"""A tuning run's results, as the text the CLI prints and as one self-contained HTML file
(tables and inline SVG plots, nothing fetched)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from contracts.config.ratelimit import Unit

from .frontier import Frontier, Point
from .traces import Series, Window
from .whatif import WhatIf, format_bound


def iso(ts: float | None) -> str | None:
    """Epoch seconds as ISO 8601 UTC, to the second (None stays None: open)."""
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Span:
    """The window a run read, and how it was asked for (the options as given, or the default)."""

    window: Window = Window()
    since_arg: str | None = None
    until_arg: str | None = None
    default: bool = False  # --since was not given: the metering store's default

    def describe(self) -> str:
        w = self.window
        if w.since is None and w.until is None:
            return "window: the whole input"
        asked = [f"--since {self.since_arg}{', the default' if self.default else ''}" if self.since_arg else "",
                 f"--until {self.until_arg}" if self.until_arg else ""]
        how = ", ".join(x for x in asked if x)
        return f"window: {iso(w.since) or 'the start'} .. {iso(w.until) or 'the end'} ({how})"

    def as_json(self) -> dict[str, object]:
        return {"since": iso(self.window.since), "until": iso(self.window.until),
                "since_arg": self.since_arg, "until_arg": self.until_arg, "default": self.default}


@dataclass
class Run:
    source: str
    key: str
    unit: Unit
    target: float
    max_wait_s: float | None
    frontiers: list[Frontier]
    series: Mapping[str, Series]
    current: WhatIf | None = None  # the current config's limits on this traffic
    recommended: WhatIf | None = None  # the same with the recommendation applied
    config_path: str | None = None
    notes: list[str] = field(default_factory=list)
    span: Span = Span()  # the times read

    @property
    def requests(self) -> int:
        return sum(f.requests for f in self.frontiers)


def _burst(p: Point | None) -> str:
    return "-" if p is None or p.burst is None else str(p.burst)


def _wait(p: Point) -> str:
    if p.rejected == 0:
        return "-"
    return "never" if p.max_wait_s is None else f"{p.max_wait_s:.3g}s"


def heading(run: Run) -> str:
    wait = f", every refusal's wait <= {run.max_wait_s:g}s" if run.max_wait_s is not None else ""
    return (f"{run.source}: {run.requests} requests; key {run.key}, unit {run.unit}; "
            f"target rejected <= {run.target:.2%}{wait}\n{run.span.describe()}")


def frontier_rows(fr: Frontier) -> list[list[str]]:
    return [[f"{p.rate:g}", _burst(p), str(p.rejected), f"{p.share:.2%}", _wait(p),
             "<- recommended" if p is fr.pick else ""] for p in fr.points]


def recommendation_rows(run: Run) -> list[list[str]]:
    rows = []
    for fr in run.frontiers:
        p = fr.pick
        rows.append([fr.key, str(fr.requests), f"{fr.total:g}", f"{fr.mean_rate:.3g}", f"{fr.peak_1s:g}",
                     "-" if p is None else f"{p.rate:g}", _burst(p),
                     "-" if p is None else f"{p.share:.2%}", fr.how])
    return rows


REC_HEAD = ["key", "requests", "total", "mean/s", "peak 1s", "rate/s", "burst", "rejected", "how"]
FRONTIER_HEAD = ["rate/s", "burst", "rejected", "share", "max wait", "pick"]
WHATIF_HEAD = ["key", "requests", "current: rejected", "bound by", "recommended: rejected", "bound by"]


def whatif_head(run: Run) -> list[str]:
    """The what-if table's columns: the live refusals when the input recorded them, the
    recommendation's when there is one."""
    head = WHATIF_HEAD if run.recommended is not None else WHATIF_HEAD[:4]
    if run.current is not None and run.current.total.live_rejected is not None:
        head = [*head[:2], "live: rejected", *head[2:]]
    return head


def _share(n: int, of: int) -> str:
    return f"{n} ({n / of if of else 0.0:.2%})"


def whatif_rows(run: Run) -> list[list[str]]:
    cur, rec = run.current, run.recommended
    if cur is None:
        return []
    keys = sorted(cur.per_key, key=lambda k: (-cur.per_key[k].requests, k))
    rows = []
    for k in [*keys, "(all)"]:
        a = cur.total if k == "(all)" else cur.per_key[k]
        row = [k, str(a.requests)]
        if a.live_rejected is not None:
            row.append(_share(a.live_rejected, a.requests))
        row += [f"{a.rejected} ({a.share:.2%})", format_bound(a.bound_by)]
        if rec is not None:
            b = rec.total if k == "(all)" else rec.per_key[k]
            row += [f"{b.rejected} ({b.share:.2%})", format_bound(b.bound_by)]
        rows.append(row)
    return rows


def _numeric(cell: str) -> bool:
    return cell == "-" or cell == "never" or cell[:1].isdigit()


def table(head: list[str], rows: list[list[str]]) -> str:
    """Every column named and as wide as its widest cell; columns of numbers right-aligned
    (their header too), text left-aligned."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = [all(_numeric(r[i]) for r in rows) and any(r[i][:1].isdigit() for r in rows) for i in range(len(head))]
    fmt = "  ".join(f"{{:{'>' if r else '<'}{w}}}" for w, r in zip(widths, right))
    lines = [fmt.format(*head).rstrip(), fmt.format(*("-" * w for w in widths))]
    lines += [fmt.format(*r).rstrip() for r in rows]
    return "\n".join(lines)


def text(run: Run, *, curves: bool = True) -> str:
    out = [heading(run), ""]
    if curves:
        for fr in run.frontiers:
            total = f", {fr.total:g} {run.unit}" if run.unit != "requests" else ""
            out.append(f"{run.key} {fr.key}: {fr.requests} requests{total}, "
                       f"mean {fr.mean_rate:.3g} {run.unit}/s, busiest second {fr.peak_1s:g} {run.unit}")
            out.append(table(FRONTIER_HEAD, frontier_rows(fr)))
            out.append("")
    out.append("recommended")
    out.append(table(REC_HEAD, recommendation_rows(run)))
    if run.current is not None:
        out.append("")
        out.append(f"what-if: every limit of {run.config_path} on this traffic (all scopes and units, "
                   f"one decision per request), by {run.key}")
        out.append(table(whatif_head(run), whatif_rows(run)))
    out += [f"note: {n}" for n in run.notes]
    return "\n".join(out)


def as_json(run: Run) -> dict[str, object]:
    """`--json`: per key the demand seen, the what-if of the config in use, what the live limiter
    refused (when the input recorded its decisions) and the recommendation."""
    cur, rec = run.current, run.recommended
    keys: list[dict[str, object]] = []
    for fr in run.frontiers:
        p = fr.pick
        c = cur.per_key.get(fr.key) if cur is not None else None
        r = rec.per_key.get(fr.key) if rec is not None else None
        keys.append({
            "key": fr.key, "requests": fr.requests, "total": fr.total, "mean_rate": fr.mean_rate,
            "peak_1s": fr.peak_1s,
            "live_rejected": None if c is None else c.live_rejected,
            "current_rejected": None if c is None else c.rejected,
            "current_bound_by": None if c is None else dict(c.bound_by),
            "rate": None if p is None else p.rate, "burst": None if p is None else p.burst,
            "rejected": None if p is None else p.rejected, "how": fr.how,
            "recommended_rejected": None if r is None else r.rejected,
        })
    out: dict[str, object] = {"source": run.source, "key": run.key, "unit": run.unit, "target": run.target,
                              "config": run.config_path, "window": run.span.as_json(),
                              "requests": run.requests, "keys": keys,
                              "notes": run.notes}
    if cur is not None:
        out["total"] = {"requests": cur.total.requests, "live_rejected": cur.total.live_rejected,
                        "current_rejected": cur.total.rejected,
                        "recommended_rejected": None if rec is None else rec.total.rejected}
    return out


_CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;margin:1em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}
tr.pick{background:#fff3bf}h2{margin-top:2em}pre{background:#f6f6f6;padding:1em}"""


def _html_table(head: list[str], rows: list[list[str]], pick_col: int | None = None) -> str:
    e = html.escape
    out = ["<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        cls = ' class="pick"' if pick_col is not None and r[pick_col] else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>")
    return "\n".join(out) + "</table>"


def html_page(run: Run, figures: Mapping[str, str], diff_text: str | None = None) -> str:
    """`figures`: title -> inline SVG text."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>modelyard ratelimit tune</title>"
             f"<style>{_CSS}</style></head><body>",
             "<h1>Rate limit tuning</h1>", f"<p>{e(heading(run))}</p>",
             "<h2>Recommended</h2>", _html_table(REC_HEAD, recommendation_rows(run))]
    if run.current is not None:
        parts += [f"<h2>What-if: {e(str(run.config_path))} vs recommended</h2>",
                  "<p>Every limit (all scopes and units, one all-or-nothing decision per request); "
                  "'bound by' is the rule whose bucket refused (the longest wait).</p>",
                  _html_table(whatif_head(run), whatif_rows(run))]
    if diff_text:
        parts += ["<h2>Config diff</h2>", f"<pre>{e(diff_text)}</pre>"]
    for title, svg in figures.items():
        parts += [f"<h2>{e(title)}</h2>", svg]
    parts.append("<h2>Frontier per key</h2>")
    for fr in run.frontiers:
        parts += [f"<h3>{e(fr.key)}</h3>", _html_table(FRONTIER_HEAD, frontier_rows(fr), pick_col=5)]
    parts += [f"<p>note: {e(n)}</p>" for n in run.notes]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
