"""`modelyard ratelimit tune`: from recorded traffic to the limits to configure.

Reads a trace (CSV/JSON lines), the metering store or Envoy's JSON access log; sweeps rates per
key and finds each rate's smallest burst by exact replay (the limiter's bucket math); recommends
a point; replays the current limits (--config, by default the config in use) and the
recommendation over the same traffic; writes the recommended `ratelimit:` section, a diff, plots,
an HTML report, or --json for scripts. With no input named, it reads the config's metering store.
"""

from __future__ import annotations

import argparse
import math
import os
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from contracts.errors import ConfigError
from contracts.when import parse_when

from . import emit
from .frontier import Frontier, auto_rates, sweep
from .report import Run, Span, as_json, html_page, iso, text
from .traces import KEYS, TraceError, Window, load, stored_span
from .whatif import simulate

CONFIG_ENV = "MODELYARD_CONFIG"  # the variable `modelyard up` and `serve` read their config from
_REPO_CONFIG = Path(__file__).resolve().parents[2] / "modelyard.yaml"
# A week: every daily peak and the weekday/weekend swing the limits must carry, while the traffic
# (and the config the live decisions were made under) is still the one the limits will meet.
DEFAULT_SINCE = "7d"


def config_in_use() -> Path | None:
    """The file `modelyard up` reads when not told: $MODELYARD_CONFIG, else ./modelyard.yaml, else
    the project's own; None when none of them is there."""
    env = os.environ.get(CONFIG_ENV)
    for p in ([Path(env)] if env else [Path("modelyard.yaml"), _REPO_CONFIG]):
        if p.is_file():
            return p
    return None


def metering_db_of(config: Path) -> Path | None:
    """`extproc.metering_db` of a modelyard.yaml, relative to the file's directory (as `up` runs it)."""
    with open(config) as f:
        raw = yaml.safe_load(f) or {}
    db = (raw.get("extproc") or {}).get("metering_db") if isinstance(raw, dict) else None
    if not db:
        return None
    p = Path(str(db))
    return p if p.is_absolute() else config.parent / p


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
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", help="CSV with a header or JSON lines: timestamp, tenant/tier/cluster/channel/"
                     "model (or key), tokens or cost")
    src.add_argument("--metering-db", help="the extproc's metering store (default: the config's extproc.metering_db)")
    src.add_argument("--access-log", help="Envoy's JSON access log (an environment's access_log, format json)")
    p.add_argument("--since", help="read from this time on: 7d, 12h, 30m or an ISO date/time (UTC), as `modelyard "
                   f"spend` takes it; default: {DEFAULT_SINCE} for the metering store, the whole file for --trace "
                   "and --access-log")
    p.add_argument("--until", help="read up to (not including) this time, in the same forms; default: now")
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
    p.add_argument("--config", help="modelyard.yaml: replay its ratelimit limits over this traffic (what-if); "
                   "default: the config in use ($MODELYARD_CONFIG, else ./modelyard.yaml) when there is one")
    p.add_argument("--no-config", action="store_true", help="no what-if, not even with the config in use")
    p.add_argument("--emit-config", help="write the recommended ratelimit: section here")
    p.add_argument("--diff", action="store_true", help="print the recommended section against --config's")
    p.add_argument("--plot", help="demand, bucket level, frontier and distribution: a .svg or .png")
    p.add_argument("--report", help="one self-contained HTML file with the tables and plots")
    p.add_argument("--quiet-curves", action="store_true", help="print the recommendation only, not every curve")
    p.add_argument("--json", action="store_true", help="print JSON for scripts: {\"keys\": [{key, requests, "
                   "current_rejected, rate, burst, rejected, ...}]} (other outputs are still written)")
    return p


def _span(a: argparse.Namespace, source: str, now: float) -> Span:
    """The window asked for, with the metering store's default; ValueError names the bad option."""
    since_arg = a.since if a.since is not None else (DEFAULT_SINCE if source == "metering" else None)
    bounds: list[float | None] = []
    for opt, raw in (("--since", since_arg), ("--until", a.until)):
        try:
            bounds.append(None if raw is None else parse_when(raw, now))
        except ValueError:
            raise ValueError(f"{opt} {raw!r}: expected 7d, 12h, 30m or an ISO date") from None
    since, until = bounds
    if since is not None and until is None:
        until = now  # pinned: a store still being written reads as one definite window
    if since is not None and until is not None and since >= until:
        raise ValueError(f"--since ({iso(since)}) must be before --until ({iso(until)})")
    return Span(Window(since, until), since_arg, a.until, default=a.since is None and since_arg is not None)


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _warnings(ts_us: list[int], run: Run, target: float) -> list[str]:
    """What a reader must know before applying the recommendation."""
    out = []
    span_s = (ts_us[-1] - ts_us[0]) / 1e6 if ts_us else 0.0
    if span_s < 60:
        out.append(f"the traffic spans {span_s:.3g}s: its rates are a burst's, not a steady state's")
    if run.current is not None:
        picks = {f.key: f.pick for f in run.frontiers}
        for key, tally in sorted(run.current.per_key.items()):
            own = f"{run.key}:{key}:{run.unit}"  # an exact rule for this very key
            p = picks.get(key)
            if p is not None and tally.requests and tally.rejected > target * tally.requests and own in tally.bound_by:
                out.append(f"{key}: {tally.rejected} of {tally.requests} refused by its own rule {own}; the "
                           f"recommendation ({p.rate:g}/s, burst {p.burst}) lifts it: keep that rule if the limit is "
                           "deliberate")
    return out


def _say(a: argparse.Namespace, line: str) -> None:
    """What was written: on stdout, or on stderr when stdout is the JSON."""
    print(line.lstrip("\n") if a.json else line, file=sys.stderr if a.json else sys.stdout)


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
    if a.config is None and not a.no_config:
        found = config_in_use()
        a.config = None if found is None else str(found)
    if a.no_config:
        a.config = None
    source, path = (("trace", a.trace) if a.trace else ("metering", a.metering_db) if a.metering_db
                    else ("access-log", a.access_log) if a.access_log else ("metering", None))
    try:
        span = _span(a, source, time.time())
    except ValueError as e:
        return _fail(str(e))
    if path is None:
        try:
            db = metering_db_of(Path(a.config)) if a.config else None
        except (OSError, yaml.YAMLError) as e:
            return _fail(f"{a.config}: {e}")
        if db is None:
            return _fail("name an input: --metering-db, --trace or --access-log (no config in use names "
                         "extproc.metering_db)")
        path = str(db)
    try:
        trace = load(Path(path), source, a.key, a.unit, span.window)
        if not len(trace) and source == "metering" and span.window != Window():
            n, first, last = stored_span(Path(path))
            return _fail(f"{path}: no events in {span.describe()}" + (
                f" (the store holds {n}, {iso(first)} .. {iso(last)}: widen --since/--until)" if n else ""))
    except (OSError, TraceError, sqlite3.Error) as e:
        return _fail(f"{path}: {e}")
    if not len(trace):
        return _fail(f"{path}: no events" + (f" in {span.describe()}" if span.window != Window() else ""))
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
    run = Run(f"{Path(path).name}", a.key, a.unit, a.target, a.max_wait, frontiers, series, config_path=a.config,
              span=span)
    if source == "metering" and trace.live_refused is None:
        run.notes.append("this metering store has no decisions table (written before it existed): admitted calls "
                         "only, so refused demand is invisible and the what-if undercounts")

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
    run.notes += _warnings(trace.ts_us, run, a.target)
    if a.json:
        print(orjson.dumps(as_json(run), option=orjson.OPT_INDENT_2).decode())
    else:
        print(text(run, curves=not a.quiet_curves))
    diff_text = emit.diff(current or {}, recommended, a.config or "empty") if recommended is not None else None
    if a.diff and not a.json:
        print("\n" + (diff_text or "no diff: nothing to recommend") if diff_text != "" else "\nno change")
    try:
        if a.emit_config:
            if recommended is None:
                return _fail(f"--emit-config: nothing to write ({'; '.join(run.notes) or 'no recommendation'})")
            Path(a.emit_config).write_text(emit.render(recommended))
            _say(a, f"\nconfig written to {a.emit_config}")
        if a.plot or a.report:
            from . import plots  # matplotlib loads only when a picture is asked for

            if a.plot:
                plots.save(plots.overview(frontiers, series, a.unit, a.target), Path(a.plot))
                _say(a, f"plot written to {a.plot}")
            if a.report:
                figs = {f"Demand and bucket level: {f.key}": plots.svg_text(plots.demand_figure(
                    f, series[f.key], a.unit)) for f in plots.busiest(frontiers)}
                figs["Rate/burst frontier"] = plots.svg_text(plots.frontier_figure(frontiers, a.unit, a.target))
                figs["Per-second demand"] = plots.svg_text(plots.distribution_figure(frontiers, series, a.unit))
                Path(a.report).write_text(html_page(run, figs, diff_text))
                _say(a, f"report written to {a.report}")
    except OSError as e:
        return _fail(f"cannot write: {e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
