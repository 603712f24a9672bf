"""Traffic to replay: read from a CSV/JSON-lines trace, the metering store or Envoy's JSON access log.

A `Trace` holds one row per request, sorted by time, as columns: the time (microseconds), its
request and token costs (nano-units, as the limiter counts them) and the context fields a bucket
key can come from (tenant, tier, cluster, channel, model). `series(key, unit)` cuts it into one
(times, costs) pair per key value, the input of a replay.
"""

from __future__ import annotations

import csv
import math
import sqlite3
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import orjson

from contracts.config.ratelimit import Unit

from ..bucket import NANO, US

FIELDS = ("tenant", "tier", "cluster", "channel", "model")
KEYS = (*FIELDS, "global")  # what `--key` may name; global is the one bucket over everything

Series = tuple[list[int], list[int]]  # (times in us, costs in nano-units), sorted by time


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line."""


@dataclass
class Trace:
    ts_us: list[int] = field(default_factory=list)
    req_nano: list[int] = field(default_factory=list)
    tok_nano: list[int] = field(default_factory=list)
    cols: dict[str, list[str | None]] = field(default_factory=lambda: {f: [] for f in FIELDS})
    has_tokens: bool = False
    # Per row, whether the live limiter refused it: None when the input does not say (a trace, an
    # access log, a metering store from before the `decisions` table).
    live_refused: list[bool] | None = None

    def __len__(self) -> int:
        return len(self.ts_us)

    def add(self, ts_us: int, req_nano: int, tok_nano: int, ctx: Mapping[str, str | None]) -> None:
        self.ts_us.append(ts_us)
        self.req_nano.append(req_nano)
        self.tok_nano.append(tok_nano)
        for f in FIELDS:
            self.cols[f].append(ctx.get(f))

    def sorted(self) -> Trace:
        """The same rows in time order (stable: rows with one timestamp keep their file order)."""
        order = sorted(range(len(self.ts_us)), key=self.ts_us.__getitem__)
        if all(i == j for i, j in enumerate(order)):
            return self
        live = self.live_refused
        return Trace([self.ts_us[i] for i in order], [self.req_nano[i] for i in order],
                     [self.tok_nano[i] for i in order],
                     {f: [c[i] for i in order] for f, c in self.cols.items()}, self.has_tokens,
                     None if live is None else [live[i] for i in order])

    def costs(self, unit: Unit) -> list[int]:
        return self.req_nano if unit == "requests" else self.tok_nano

    def series(self, key: str, unit: Unit) -> dict[str, Series]:
        """Per value of `key`: its requests' times and costs in `unit`. Rows without the field are
        left out (the limiter skips a scope whose context field is None)."""
        if key not in KEYS:
            raise TraceError(f"unknown key {key!r} (one of {', '.join(KEYS)})")
        costs = self.costs(unit)
        if key == "global":
            return {"*": (list(self.ts_us), list(costs))} if self.ts_us else {}
        out: dict[str, Series] = {}
        for ts, c, v in zip(self.ts_us, costs, self.cols[key]):
            if v is None:
                continue
            s = out.get(v)
            if s is None:
                s = out[v] = ([], [])
            s[0].append(ts)
            s[1].append(c)
        return out


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


def _nano(raw: object, default: float, what: str, where: str) -> int:
    if raw is None or raw == "":
        v = default
    elif isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise TraceError(f"{where}: {what} {raw!r} is not a number")
    else:
        try:
            v = float(raw)
        except ValueError:
            raise TraceError(f"{where}: {what} {raw!r} is not a number") from None
    if not math.isfinite(v) or v < 0 or v > 1e9:
        raise TraceError(f"{where}: {what} must be a number in [0, 1e9]")
    return round(v * NANO)


def _text(raw: object) -> str | None:
    return None if raw is None or raw == "" or raw == "-" else str(raw)


def _rows(records: Iterable[tuple[int, Mapping[str, object]]], key: str, unit: Unit) -> Trace:
    """Trace rows: `timestamp`, the context fields, `tokens` (or input_tokens + output_tokens), and
    the older `key`/`cost` columns: `key` fills the field `key` names, `cost` the unit's cost."""
    tr = Trace()
    legacy_field = "tenant" if key == "global" else key
    for n, rec in records:
        where = f"line {n}"
        if "timestamp" not in rec:
            raise TraceError(f"{where}: needs 'timestamp'")
        ts = _ts_us(rec["timestamp"], where)
        ctx = {f: _text(rec.get(f)) for f in FIELDS}
        if "key" in rec:
            ctx[legacy_field] = _text(rec["key"])
        elif not any(ctx.values()) and key != "global":
            raise TraceError(f"{where}: needs 'key' or one of {', '.join(FIELDS)}")
        req, tok = NANO, 0
        if "tokens" in rec:
            tok = _nano(rec["tokens"], 0, "tokens", where)
            tr.has_tokens = True
        elif "input_tokens" in rec or "output_tokens" in rec:
            tok = (_nano(rec.get("input_tokens"), 0, "input_tokens", where)
                   + _nano(rec.get("output_tokens"), 0, "output_tokens", where))
            tr.has_tokens = True
        if "cost" in rec:
            c = _nano(rec["cost"], 1, "cost", where)
            if unit == "requests":
                req = c
            else:
                tok, tr.has_tokens = c, True
        tr.add(ts, req, tok, ctx)
    return tr.sorted()


def parse_trace(text: str, fmt: str, key: str = "tenant", unit: Unit = "requests") -> Trace:
    """A CSV (with a header) or JSON-lines trace."""
    if fmt == "jsonl":
        def records() -> Iterable[tuple[int, Mapping[str, object]]]:
            for n, line in enumerate(text.splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    raise TraceError(f"line {n}: invalid JSON ({e})") from None
                if not isinstance(rec, dict):
                    raise TraceError(f"line {n}: expected a JSON object")
                yield n, rec
        return _rows(records(), key, unit)
    try:
        return _rows(enumerate(csv.DictReader(text.splitlines()), 2), key, unit)
    except csv.Error as e:
        raise TraceError(f"CSV: {e}") from None


def parse_access_log(text: str) -> Trace:
    """Envoy's JSON access log as Modelyard's environments write it (controlplane/bootstrap.py):
    `time` (ISO 8601), `cluster` (a `<cluster>~failover` aggregate counts as its primary), and,
    when the log format carries them, tenant/tier/channel/model. Requests only: the log has no
    token counts. Lines that are not JSON objects (Envoy's own messages) are skipped."""
    tr = Trace()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.startswith("{"):
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(rec, dict) or "time" not in rec:
            continue
        ctx = {f: _text(rec.get(f)) for f in FIELDS}
        cluster = ctx["cluster"]
        if cluster is not None:
            ctx["cluster"] = cluster.split("~", 1)[0] or None
        tr.add(_ts_us(rec["time"], f"line {n}"), NANO, 0, ctx)
    return tr.sorted()


@dataclass(frozen=True, slots=True)
class Window:
    """The times read: `since` <= ts < `until` (epoch seconds; None: open on that side)."""

    since: float | None = None
    until: float | None = None

    def sql(self, col: str = "ts") -> tuple[str, tuple[float, ...]]:
        """`col`'s condition (TRUE when open) and its parameters."""
        parts, args = [], []
        if self.since is not None:
            parts.append(f"{col} >= ?")
            args.append(self.since)
        if self.until is not None:
            parts.append(f"{col} < ?")
            args.append(self.until)
        return " AND ".join(parts) or "1", tuple(args)

    def cut(self, tr: Trace) -> Trace:
        """The rows of a sorted trace inside the window (a file's rows are all read, then cut)."""
        lo = 0 if self.since is None else bisect_left(tr.ts_us, math.ceil(self.since * US))
        hi = len(tr) if self.until is None else bisect_left(tr.ts_us, math.ceil(self.until * US))
        if lo == 0 and hi == len(tr):
            return tr
        live = tr.live_refused
        return Trace(tr.ts_us[lo:hi], tr.req_nano[lo:hi], tr.tok_nano[lo:hi],
                     {f: c[lo:hi] for f, c in tr.cols.items()}, tr.has_tokens,
                     None if live is None else live[lo:hi])


def read_metering(path: Path, window: Window = Window()) -> Trace:
    """The metering store (extproc/telemetry/metering.py): its `decisions` table when it has one,
    every rate-limit decision, refused ones included (the whole demand: requests and tokens asked
    for; an admitted call's tokens are what the upstream reported, when its `requests` row is
    there); else, from an older store, the `requests` table: admitted calls only. Only the rows
    inside `window`, selected by SQL: a store kept for weeks is not read whole."""
    if not path.exists():
        raise TraceError("no such metering database")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='decisions'").fetchone()
        if has and conn.execute("SELECT 1 FROM decisions LIMIT 1").fetchone():
            return _read_decisions(conn, window)
        return _read_requests(conn, window)


def stored_span(path: Path) -> tuple[int, float | None, float | None]:
    """How many rows the store the tuner reads holds, and its first and last times (for the
    message when a window holds none)."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        has = conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='decisions'").fetchone()
        table = "decisions" if has and conn.execute("SELECT 1 FROM decisions LIMIT 1").fetchone() else "requests"
        n, first, last = conn.execute(f"SELECT COUNT(*), MIN(ts), MAX(ts) FROM {table}").fetchone()
    return int(n), first, last


def _read_decisions(conn: sqlite3.Connection, window: Window) -> Trace:
    # A call refused after admission (its queue) has no requests row: its estimate stands. An async
    # task is decided twice (accepted, then replayed): the usage belongs to the last decision only.
    # A spent budget's refusals (store 'budget') never reached the buckets: not their demand.
    cond, args = window.sql()
    q = ("SELECT d.ts, d.tenant, d.tier, d.cluster, d.channel, d.model, d.allowed, d.requests, "
         "CASE WHEN d.allowed AND d.rid = d.last AND r.task_id IS NOT NULL "
         "THEN COALESCE(r.input_tokens, 0) + COALESCE(r.output_tokens, 0) ELSE d.tokens END "
         "FROM (SELECT *, rowid AS rid, MAX(rowid) OVER (PARTITION BY task_id) AS last FROM decisions "
         f"WHERE store IS NOT 'budget' AND {cond}) d "
         "LEFT JOIN (SELECT task_id, MAX(input_tokens) AS input_tokens, MAX(output_tokens) AS output_tokens "
         "FROM requests GROUP BY task_id) r ON r.task_id = d.task_id AND d.task_id != '' "
         "ORDER BY d.ts, d.rid")
    live: list[bool] = []
    tr = Trace(has_tokens=True, live_refused=live)
    for ts, tenant, tier, cluster, channel, model, allowed, requests, tokens in conn.execute(q, args):
        tr.ts_us.append(round(ts * US))
        tr.req_nano.append(max(0, int(requests)) * NANO)
        tr.tok_nano.append(max(0, int(tokens or 0)) * NANO)
        live.append(not allowed)
        for f, v in zip(FIELDS, (tenant, tier, cluster, channel, model)):
            tr.cols[f].append(_text(v))
    return tr


def _read_requests(conn: sqlite3.Connection, window: Window) -> Trace:
    cond, args = window.sql()
    q = ("SELECT ts, tenant, tier, cluster, channel, model, "
         f"COALESCE(input_tokens, 0) + COALESCE(output_tokens, 0) FROM requests WHERE {cond} ORDER BY ts")
    tr = Trace(has_tokens=True)
    for ts, tenant, tier, cluster, channel, model, tokens in conn.execute(q, args):
        tr.ts_us.append(round(ts * US))
        tr.req_nano.append(NANO)
        tr.tok_nano.append(max(0, int(tokens)) * NANO)
        for f, v in zip(FIELDS, (tenant, tier, cluster, channel, model)):
            tr.cols[f].append(_text(v))
    return tr


def load(path: Path, source: str, key: str, unit: Unit, window: Window = Window()) -> Trace:
    """`source`: trace | metering | access-log; the rows inside `window`."""
    if source == "metering":
        return read_metering(path, window)
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise TraceError(f"not text ({e})") from None
    if source == "access-log":
        return window.cut(parse_access_log(text))
    fmt = "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson", ".json") else "csv"
    return window.cut(parse_trace(text, fmt, key, unit))
