"""`modelyard ratelimit tune`: recommend a burst per key from a recorded trace.

The trace (CSV with a header, or JSONL) holds `timestamp` (seconds, or ISO 8601), `key`, `cost`
(default 1). Each key's requests are replayed at the given rate against candidate bursts with the
same integer bucket math the limiter runs; a binary search finds the smallest burst whose
rejected share of requests stays at or under the target. A plot shows demand against the bucket
level at the recommended burst (SVG written by hand; PNG through Pillow).
"""

from __future__ import annotations

import argparse
import csv
import math
import sqlite3
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import orjson

from . import bucket
from .bucket import NANO, US, BucketParams


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    key: str
    requests: int
    total_cost: float
    burst: int
    rejected: int

    @property
    def rejection_rate(self) -> float:
        return self.rejected / self.requests if self.requests else 0.0


def _ts_us(raw: object, where: str) -> int:
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        v = float(raw)
    else:
        text = str(raw).strip()
        try:
            v = float(text)
        except ValueError:
            try:
                v = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise TraceError(f"{where}: timestamp {text!r} is neither seconds nor ISO 8601") from None
    if not math.isfinite(v) or abs(v) > 1e11:
        raise TraceError(f"{where}: timestamp must be seconds within +-1e11")
    return round(v * US)


def _cost_nano(raw: str | float | None, where: str) -> int:
    try:
        v = float(raw) if raw not in (None, "") else 1.0
    except (TypeError, ValueError):
        raise TraceError(f"{where}: cost {raw!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or v > 1e9:
        raise TraceError(f"{where}: cost must be a number in [0, 1e9]")
    return round(v * NANO)


def _row(rec: dict, where: str) -> tuple[str, int, int]:
    if "timestamp" not in rec or "key" not in rec:
        raise TraceError(f"{where}: needs 'timestamp' and 'key'")
    return str(rec["key"]), _ts_us(rec["timestamp"], where), _cost_nano(rec.get("cost"), where)


def parse_trace(text: str, fmt: str) -> dict[str, list[tuple[int, int]]]:
    """Events per key as (time us, cost nano), sorted by time."""
    rows: list[tuple[str, int, int]] = []
    if fmt == "jsonl":
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise TraceError(f"line {n}: invalid JSON ({e})") from None
            if not isinstance(rec, dict):
                raise TraceError(f"line {n}: expected a JSON object")
            rows.append(_row(rec, f"line {n}"))
    else:
        reader = csv.DictReader(text.splitlines())
        for n, rec in enumerate(reader, 2):
            rows.append(_row(rec, f"line {n}"))
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for key, ts, cost in rows:
        out[key].append((ts, cost))
    for evs in out.values():
        evs.sort()
    return dict(out)


def replay(events: list[tuple[int, int]], params: BucketParams, levels: list | None = None) -> int:
    """Rejected requests when `events` meet a bucket that starts full; optionally record levels."""
    if not events:
        return 0
    st = bucket.full(params, events[0][0])
    rejected = 0
    for ts, cost in events:
        ok, st, _ = bucket.try_take(st, params, cost, ts)
        if not ok:
            rejected += 1
        if levels is not None:
            levels.append((ts, st.level_nano))
    return rejected


def recommend(key: str, events: list[tuple[int, int]], rate: float, target: float) -> Recommendation:
    """The smallest whole burst whose replay rejects at most `target` of the requests."""
    total = sum(c for _, c in events)
    allowed = math.floor(target * len(events) + 1e-9)
    lo, hi = 1, max(1, -(-total // NANO))  # a bucket holding the whole trace never refuses
    rate_milli = round(rate * 1000)
    while lo < hi:
        mid = (lo + hi) // 2
        if replay(events, BucketParams(rate_milli, mid * NANO)) <= allowed:
            hi = mid
        else:
            lo = mid + 1
    rej = replay(events, BucketParams(rate_milli, hi * NANO))
    return Recommendation(key, len(events), total / NANO, hi, rej)


def format_table(recs: list[Recommendation], rate: float, target: float) -> str:
    lines = [f"rate {rate:g}/s, target rejection <= {target:.2%}", ""]
    head = f"{'key':<32} {'requests':>9} {'total cost':>12} {'burst':>9} {'rejected':>9}"
    lines += [head, "-" * len(head)]
    for r in recs:
        lines.append(
            f"{r.key[:32]:<32} {r.requests:>9} {r.total_cost:>12g} {r.burst:>9} {r.rejection_rate:>9.2%}"
        )
    return "\n".join(lines)


# -- plot: shapes first, then SVG text or a Pillow image --

_W, _PANEL_H, _PAD = 900, 220, 50


def _shapes(series: list[tuple[Recommendation, list[tuple[int, int]], list[tuple[int, int]]]]) -> list[tuple]:
    shapes: list[tuple] = []
    for i, (rec, events, levels) in enumerate(series):
        top = i * _PANEL_H + 30
        h = _PANEL_H - 60
        x0, x1 = _PAD, _W - 20
        t0, t1 = events[0][0], events[-1][0]
        span = max(1, t1 - t0)
        bins = 80
        demand = [0] * bins
        for ts, cost in events:
            demand[min(bins - 1, (ts - t0) * bins // span)] += cost
        dmax = max(demand) or 1
        bw = (x1 - x0) / bins
        for b, d in enumerate(demand):
            bh = h * d / dmax
            shapes.append(("rect", x0 + b * bw, top + h - bh, bw * 0.9, bh, "#9ecae1"))
        burst = rec.burst * NANO
        pts = [(x0 + (x1 - x0) * (ts - t0) / span, top + h - h * max(0, lv) / burst) for ts, lv in levels]
        shapes.append(("line", x0, top + h, x1, top + h, "#444"))
        shapes.append(("line", x0, top, x0, top + h, "#444"))
        shapes.append(("poly", pts, "#d62728"))
        title = (
            f"{rec.key}: burst {rec.burst}, rejected {rec.rejection_rate:.2%} "
            f"(bars: demand per bin, max {dmax / NANO:g}; red: bucket level 0..{rec.burst})"
        )
        shapes.append(("text", x0, top - 8, title, "#000"))
        shapes.append(("text", x0, top + h + 16, f"0 s .. {span / US:g} s", "#444"))
    return shapes


def _svg_escape(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def render_svg(shapes: list[tuple], height: int) -> str:
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" '
        f'viewBox="0 0 {_W} {height}" font-family="sans-serif" font-size="12">',
        f'<rect x="0" y="0" width="{_W}" height="{height}" fill="#fff"/>',
    ]
    for s in shapes:
        if s[0] == "rect":
            out.append(f'<rect x="{s[1]:.1f}" y="{s[2]:.1f}" width="{s[3]:.1f}" height="{s[4]:.1f}" fill="{s[5]}"/>')
        elif s[0] == "line":
            out.append(f'<line x1="{s[1]:.1f}" y1="{s[2]:.1f}" x2="{s[3]:.1f}" y2="{s[4]:.1f}" stroke="{s[5]}"/>')
        elif s[0] == "poly":
            pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in s[1])
            out.append(f'<polyline points="{pts}" fill="none" stroke="{s[2]}" stroke-width="1.5"/>')
        elif s[0] == "text":
            out.append(f'<text x="{s[1]:.1f}" y="{s[2]:.1f}" fill="{s[4]}">{_svg_escape(s[3])}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def render_png(shapes: list[tuple], height: int, path: Path) -> None:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (_W, height), "white")
    d = ImageDraw.Draw(img)
    for s in shapes:
        if s[0] == "rect":
            d.rectangle([s[1], s[2], s[1] + s[3], s[2] + s[4]], fill=s[5])
        elif s[0] == "line":
            d.line([s[1], s[2], s[3], s[4]], fill=s[5])
        elif s[0] == "poly" and len(s[1]) > 1:
            d.line(s[1], fill=s[2], width=2)
        elif s[0] == "text":
            d.text((s[1], s[2] - 12), s[3], fill=s[4])
    img.save(path)


def write_plot(path: Path, trace: dict[str, list[tuple[int, int]]], recs: list[Recommendation], rate: float) -> None:
    top = sorted(recs, key=lambda r: -r.requests)[:4]
    series = []
    for r in top:
        levels: list[tuple[int, int]] = []
        replay(trace[r.key], BucketParams(round(rate * 1000), r.burst * NANO), levels)
        series.append((r, trace[r.key], levels))
    height = _PANEL_H * max(1, len(series)) + 10
    shapes = _shapes(series)
    if path.suffix.lower() == ".png":
        render_png(shapes, height, path)
    else:
        path.write_text(render_svg(shapes, height))


METERING_KEYS = ("tenant", "tier", "cluster", "channel", "model")


def trace_from_metering(path: Path, key: str, unit: str) -> dict[str, list[tuple[int, int]]]:
    """Events per key from the metering store's `requests` table (see extproc/telemetry/metering.py)."""
    if key not in METERING_KEYS:
        raise TraceError(f"unknown key {key!r}")
    if not path.exists():
        raise TraceError("no such metering database")
    cost = "1" if unit == "requests" else "COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0)"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        rows = conn.execute(f"SELECT {key}, ts, {cost} FROM requests ORDER BY ts").fetchall()
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for k, ts, c in rows:
        out[str(k)].append((int(ts * US), int(c) * NANO))
    return dict(out)


def main(argv: list[str]) -> int:
    """Entry for `modelyard ratelimit tune ...` (a leading 'tune' is accepted and skipped)."""
    if argv and argv[0] == "tune":
        argv = argv[1:]
    p = argparse.ArgumentParser(prog="modelyard ratelimit tune", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace file: .csv (timestamp,key,cost) or .jsonl")
    src.add_argument("--metering-db", help="the extproc's metering store (extproc.metering_db)")
    p.add_argument("--key", choices=METERING_KEYS, default="tenant", help="with --metering-db: bucket key")
    p.add_argument("--unit", choices=("requests", "tokens"), default="requests", help="with --metering-db: cost")
    p.add_argument("--rate", required=True, type=float, help="bucket rate, units per second")
    p.add_argument("--target", type=float, default=0.01, help="highest acceptable rejected share")
    p.add_argument("--plot", help="write demand vs bucket level to this .svg or .png")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not (args.rate >= 0.001 and math.isfinite(args.rate)):
        print("error: --rate must be at least 0.001", file=sys.stderr)
        return 2
    if not 0 <= args.target < 1:
        print("error: --target must be in [0, 1)", file=sys.stderr)
        return 2
    path = Path(args.trace or args.metering_db)
    fmt = "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson") else "csv"
    try:
        if args.metering_db:
            trace = trace_from_metering(path, args.key, args.unit)
        else:
            trace = parse_trace(path.read_text(), fmt)
    except (OSError, UnicodeDecodeError, TraceError, csv.Error, sqlite3.Error) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        return 2
    if not trace:
        print(f"error: {path}: no events", file=sys.stderr)
        return 2
    recs = [recommend(k, evs, args.rate, args.target) for k, evs in sorted(trace.items())]
    print(format_table(recs, args.rate, args.target))
    if args.plot:
        try:
            write_plot(Path(args.plot), trace, recs, args.rate)
        except OSError as e:
            print(f"error: cannot write plot: {e}", file=sys.stderr)
            return 2
        print(f"\nplot written to {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
