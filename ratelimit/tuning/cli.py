"""`modelyard ratelimit tune`: from recorded traffic to the limits to configure.

Reads a trace (CSV/JSON lines), the metering store or Envoy's JSON access log; sweeps rates per
key and finds each rate's smallest burst by exact replay (the limiter's bucket math); recommends
a point; with --config replays the current limits and the recommendation over the same traffic;
writes the recommended `ratelimit:` section, a diff, plots and an HTML report.
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import sys
from pathlib import Path
from typing import Any

from modelyard.errors import ConfigError

from . import emit
from .frontier import Frontier, auto_rates, sweep
from .report import Run, html_page, text
from .traces import KEYS, TraceError, load
from .whatif import simulate


def _rates(raw: str) -> list[float]:
    try:
        out = [float(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of numbers") from None
    if not out or any(not (math.isfinite(r) and r >= 0.001) for r in out):
        raise argparse.ArgumentTypeError("rates must be at least 0.001")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="modelyard ratelimit tune", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="CSV with a header or JSON lines: timestamp, tenant/tier/cluster/channel/"
                     "model (or key), tokens or cost")
    src.add_argument("--metering-db", help="the extproc's metering store (extproc.metering_db)")
    src.add_argument("--access-log", help="Envoy's JSON access log (an environment's access_log, format json)")
    p.add_argument("--key", choices=KEYS, default="tenant", help="one bucket per value of this field")
    p.add_argument("--unit", choices=("requests", "tokens"), default="requests")
    p.add_argument("--target", type=float, default=0.01, help="highest acceptable rejected share of requests")
    p.add_argument("--max-wait", type=float, help="also: no refusal may be told to wait longer (seconds)")
    rates = p.add_mutually_exclusive_group()
    rates.add_argument("--rate", type=_rates, help="one rate (units/s), no sweep")
    rates.add_argument("--rates", type=_rates, help="the rates to sweep, e.g. 1,2,5,10")
    p.add_argument("--points", type=int, default=12, help="rates in the automatic sweep (mean .. busiest second)")
    p.add_argument("--max-burst", type=float, help="recommend the lowest rate whose burst stays at or under this "
                   "(default: the knee of the frontier)")
    p.add_argument("--config", help="modelyard.yaml: replay its ratelimit limits over this traffic (what-if)")
    p.add_argument("--emit-config", help="write the recommended ratelimit: section here")
    p.add_argument("--diff", action="store_true", help="print the recommended section against --config's")
    p.add_argument("--plot", help="demand, bucket level, frontier and distribution: a .svg or .png")
    p.add_argument("--report", help="one self-contained HTML file with the tables and plots")
    p.add_argument("--quiet-curves", action="store_true", help="print the recommendation only, not every curve")
    return p


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def main(argv: list[str]) -> int:
    """Entry for `modelyard ratelimit tune ...` (a leading 'tune' is accepted and skipped)."""
    if argv and argv[0] == "tune":
        argv = argv[1:]
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not 0 <= a.target < 1:
        return _fail("--target must be in [0, 1)")
    if a.max_wait is not None and not (a.max_wait >= 0 and math.isfinite(a.max_wait)):
        return _fail("--max-wait must be a number of seconds >= 0")
    if a.points < 1:
        return _fail("--points must be at least 1")
    source, path = (("trace", a.trace) if a.trace else ("metering", a.metering_db) if a.metering_db
                    else ("access-log", a.access_log))
    try:
        trace = load(Path(path), source, a.key, a.unit)
    except (OSError, TraceError, sqlite3.Error) as e:
        return _fail(f"{path}: {e}")
    if not len(trace):
        return _fail(f"{path}: no events")
    if a.unit == "tokens" and not trace.has_tokens:
        return _fail(f"{path}: no token counts in this input; use --unit requests")
    series = trace.series(a.key, a.unit)
    if not series:
        return _fail(f"{path}: no event carries a {a.key}")
    frontiers: list[Frontier] = []
    for value in sorted(series):
        rates = a.rate or a.rates or auto_rates(series[value], a.points)
        frontiers.append(sweep(value, series[value], rates, a.target, max_wait_s=a.max_wait,
                               max_burst=a.max_burst))
    run = Run(f"{Path(path).name}", a.key, a.unit, a.target, a.max_wait, frontiers, series, config_path=a.config)

    current: dict[str, Any] | None = None
    recommended: dict[str, Any] | None = None
    if a.config:
        try:
            current = emit.read_section(a.config)
            run.current = simulate(trace, emit.as_config(current), a.key)
        except (OSError, ValueError) as e:  # ConfigError is a ValueError
            return _fail(f"{a.config}: {e}")
    if a.config or a.emit_config:
        picks = {f.key: f.pick for f in frontiers if f.pick is not None}
        try:
            recommended = emit.recommended_section(current or {}, a.key, a.unit, picks)
        except ConfigError as e:
            return _fail(f"the recommendation does not validate: {e}")
        except ValueError as e:
            run.notes.append(f"no config emitted: {e}")
        if recommended is not None and current is not None:
            run.recommended = simulate(trace, emit.as_config(recommended), a.key)
    print(text(run, curves=not a.quiet_curves))
    diff_text = emit.diff(current or {}, recommended, a.config or "empty") if recommended is not None else None
    if a.diff:
        print("\n" + (diff_text or "no diff: nothing to recommend") if diff_text != "" else "\nno change")
    try:
        if a.emit_config:
            if recommended is None:
                return _fail(f"--emit-config: nothing to write ({'; '.join(run.notes) or 'no recommendation'})")
            Path(a.emit_config).write_text(emit.render(recommended))
            print(f"\nconfig written to {a.emit_config}")
        if a.plot or a.report:
            from . import plots  # matplotlib loads only when a picture is asked for

            if a.plot:
                plots.save(plots.overview(frontiers, series, a.unit, a.target), Path(a.plot))
                print(f"plot written to {a.plot}")
            if a.report:
                figs = {f"Demand and bucket level: {f.key}": plots.svg_text(plots.demand_figure(
                    f, series[f.key], a.unit)) for f in plots.busiest(frontiers)}
                figs["Rate/burst frontier"] = plots.svg_text(plots.frontier_figure(frontiers, a.unit, a.target))
                figs["Per-second demand"] = plots.svg_text(plots.distribution_figure(frontiers, series, a.unit))
                Path(a.report).write_text(html_page(run, figs, diff_text))
                print(f"report written to {a.report}")
    except OSError as e:
        return _fail(f"cannot write: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
