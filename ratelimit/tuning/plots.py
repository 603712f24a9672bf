"""Pictures of a tuning run (matplotlib, Agg backend): demand over time against the bucket level
at the chosen parameters, the rate/burst frontier per key, and the distribution of per-second
demand. Each draws on an Axes; `overview` puts them in one figure; `save` writes PNG or SVG."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: searchable, and smaller

from matplotlib.figure import Figure  # noqa: E402

from ..bucket import MILLI, NANO, US, BucketParams  # noqa: E402
from .frontier import Frontier  # noqa: E402
from .replay import trajectory  # noqa: E402
from .traces import Series  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes

MAX_BINS = 300
MAX_POINTS = 20_000  # level steps drawn one by one; beyond, a min..max band
MAX_MARKERS = 2_000


def _bins(times: list[int]) -> tuple[int, int, int]:
    """(start us, bin width us (a whole number of seconds), bin count) covering the trace."""
    t0 = times[0] - times[0] % US
    span = times[-1] - t0 + 1
    width = US * max(1, -(-span // (US * MAX_BINS)))
    return t0, width, max(1, -(-span // width))


def draw_demand(ax: Axes, fr: Frontier, series: Series, unit: str) -> None:
    """Bars: demand per bin in units/s; line (right axis): the bucket level after each request at
    the chosen rate/burst; crosses: refused requests; dashed: the burst."""
    times, costs = series
    pick = fr.pick
    t0, width, n = _bins(times)
    demand = [0] * n
    for t, c in zip(times, costs):
        demand[(t - t0) // width] += c
    w_s = width / US
    xs = [i * w_s for i in range(n)]
    ax.bar(xs, [d / NANO / w_s for d in demand], width=w_s, align="edge", color="#9ecae1",
           label=f"demand ({unit}/s, {w_s:g} s bins)")
    ax.set_xlabel("time since trace start (s)")
    ax.set_ylabel(f"demand ({unit}/s)")
    title = f"{fr.key}: {fr.requests} requests"
    if pick is None or pick.burst is None:
        ax.set_title(title + " (no recommendation)")
        ax.legend(loc="upper left", fontsize=8)
        return
    ax.axhline(pick.rate, color="#31a354", linestyle=":", label=f"rate {pick.rate:g}/s")
    levels, admitted = trajectory(times, costs, BucketParams(round(pick.rate * MILLI), pick.burst * NANO))
    rel = [(t - t0) / US for t in times]
    ax2 = ax.twinx()
    lv = [v / NANO for v in levels]
    if len(lv) <= MAX_POINTS:
        ax2.step(rel, lv, where="post", color="#d62728", linewidth=1, label="bucket level")
    else:  # a million steps is a solid block anyway: draw each pixel column's range
        step = -(-len(lv) // (MAX_POINTS // 2))
        xs2 = rel[::step]
        ax2.fill_between(xs2, [min(lv[i:i + step]) for i in range(0, len(lv), step)],
                         [max(lv[i:i + step]) for i in range(0, len(lv), step)], step="post",
                         color="#d62728", alpha=0.7, linewidth=0, label="bucket level (range)")
    ax2.axhline(pick.burst, color="#d62728", linestyle="--", linewidth=0.8, label=f"burst {pick.burst}")
    refused = [(x, v) for x, v, ok in zip(rel, lv, admitted) if not ok]
    if refused:
        shown = refused[:: -(-len(refused) // MAX_MARKERS)]
        ax2.plot(*zip(*shown), "x", color="black", markersize=4, label=f"refused ({len(refused)})")
    ax2.set_ylabel(f"bucket level ({unit})")
    ax2.set_ylim(bottom=min(0.0, min(lv)), top=pick.burst * 1.1)
    ax.set_title(f"{title}; rate {pick.rate:g}/s, burst {pick.burst}, rejected {pick.share:.2%}")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, loc="upper left", bbox_to_anchor=(1.08, 1.0), fontsize=8)


def draw_frontier(ax: Axes, frontiers: Sequence[Frontier], unit: str, target: float) -> None:
    """Smallest burst per rate, one line per key; the chosen point starred."""
    top = 0.0
    for fr in frontiers:
        pts = [(p.rate, p.burst) for p in fr.points if p.burst is not None]
        if not pts:
            continue
        line, = ax.plot(*zip(*pts), marker="o", markersize=3, label=fr.key)
        top = max(top, max(b for _, b in pts))
        if fr.pick is not None and fr.pick.burst is not None:
            ax.plot([fr.pick.rate], [fr.pick.burst], "*", markersize=12, color=line.get_color())
    ax.set_xlabel(f"rate ({unit}/s)")
    ax.set_ylabel(f"smallest burst ({unit})")
    if top > 0 and top / max(1.0, min((p.burst or top) for fr in frontiers for p in fr.points)) > 100:
        ax.set_yscale("log")
    ax.set_title(f"rate/burst frontier at <= {target:.2%} rejected (star: recommended)")
    ax.grid(alpha=0.3)
    if frontiers:
        ax.legend(fontsize=8)


def draw_distribution(ax: Axes, frontiers: Sequence[Frontier], series: Mapping[str, Series], unit: str) -> None:
    """Per key, the share of seconds whose demand exceeds x (seconds with no request count as 0);
    dotted: the chosen rate."""
    for fr in frontiers:
        times, costs = series[fr.key]
        if not times:
            continue
        first, last = times[0] // US, times[-1] // US
        per_s: dict[int, int] = {}
        for t, c in zip(times, costs):
            per_s[t // US] = per_s.get(t // US, 0) + c
        vals = sorted([v / NANO for v in per_s.values()] + [0.0] * (last - first + 1 - len(per_s)))
        n = len(vals)
        line, = ax.step(vals, [1 - (i + 1) / n for i in range(n)], where="post", label=fr.key)
        if fr.pick is not None:
            ax.axvline(fr.pick.rate, linestyle=":", color=line.get_color())
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_ylim(0, 1)
    ax.set_xlabel(f"demand in one second ({unit})")
    ax.set_ylabel("share of seconds above")
    ax.set_title("per-second demand (dotted: recommended rate)")
    ax.grid(alpha=0.3)
    if frontiers:
        ax.legend(fontsize=8)


def busiest(frontiers: Sequence[Frontier], k: int = 4) -> list[Frontier]:
    return sorted(frontiers, key=lambda f: (-f.requests, f.key))[:k]


def demand_figure(fr: Frontier, series: Series, unit: str) -> Figure:
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    draw_demand(fig.add_subplot(), fr, series, unit)
    return fig


def frontier_figure(frontiers: Sequence[Frontier], unit: str, target: float) -> Figure:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    draw_frontier(fig.add_subplot(), busiest(frontiers, 8), unit, target)
    return fig


def distribution_figure(frontiers: Sequence[Frontier], series: Mapping[str, Series], unit: str) -> Figure:
    fig = Figure(figsize=(7, 4.5), layout="constrained")
    draw_distribution(fig.add_subplot(), busiest(frontiers, 8), series, unit)
    return fig


def overview(frontiers: Sequence[Frontier], series: Mapping[str, Series], unit: str, target: float) -> Figure:
    """The busiest keys' demand panels, then the frontier and the distribution side by side."""
    shown = busiest(frontiers)
    fig = Figure(figsize=(11, 3.4 * (len(shown) + 1.3)), layout="constrained")
    grid = fig.add_gridspec(len(shown) + 1, 2, height_ratios=[1.0] * len(shown) + [1.3])
    for i, fr in enumerate(shown):
        draw_demand(fig.add_subplot(grid[i, :]), fr, series[fr.key], unit)
    draw_frontier(fig.add_subplot(grid[len(shown), 0]), busiest(frontiers, 8), unit, target)
    draw_distribution(fig.add_subplot(grid[len(shown), 1]), busiest(frontiers, 8), series, unit)
    return fig


def save(fig: Figure, path: Path) -> None:
    """PNG for a .png path, else SVG."""
    fmt = "png" if path.suffix.lower() == ".png" else "svg"
    fig.savefig(path, format=fmt, dpi=110)


def svg_text(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.index("<svg"):]  # no XML prolog or doctype inside HTML
