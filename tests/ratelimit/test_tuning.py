"""The tuner against an independent brute-force model (tests/ratelimit/brute_force.py) on generated
traffic, its emitted config through both loaders and a live Limiter, and its command line."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import xml.etree.ElementTree as ET
from fractions import Fraction as F
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.config.ratelimit import parse_config
from ratelimit import Limiter, RequestContext
from ratelimit.bucket import NANO, BucketParams
from ratelimit.tuning import emit
from ratelimit.tuning.cli import main
from ratelimit.tuning.frontier import auto_rates, knee, smallest_burst, sweep, under_cap
from ratelimit.tuning.replay import count, trajectory, zero_refusal_burst
from ratelimit.tuning.traces import TraceError, parse_access_log, parse_trace
from ratelimit.tuning.whatif import simulate

from . import brute_force as bf
from .tuning_traces import ALL, csv_text

ROOT = Path(__file__).resolve().parents[2]

LIMITS = [
    {"scope": "tenant", "match": "*", "unit": "requests", "rate": 2, "burst": 6},
    {"scope": "tenant", "match": "acme", "unit": "requests", "rate": 3, "burst": 10},
    {"scope": "tenant", "match": "*", "tier": "L3", "unit": "tokens", "rate": 900, "burst": 4000},
    {"scope": "tier", "match": "L2", "unit": "requests", "rate": 1.5, "burst": 5},
    {"scope": "cluster", "match": "gpu-a", "unit": "requests", "rate": 5, "burst": 12},
    {"scope": "channel", "match": "fast", "unit": "tokens", "rate": 3000, "burst": 9000},
    {"scope": "global", "unit": "requests", "rate": 7, "burst": 15},
]


def _trace(rows):
    return parse_trace(csv_text(rows), "csv")


def _fr(series):
    times, costs = series
    return [F(t, 10**6) for t in times], [F(c, NANO) for c in costs]


# -- the replay kernel is the bucket's own math --

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3_000_000), st.integers(0, 5 * NANO)), min_size=1, max_size=60),
       st.integers(1, 5000), st.integers(1, 6 * NANO))
def test_count_matches_try_take_loop(evs, rate_milli, burst_nano):
    evs.sort()
    times, costs = [t for t, _ in evs], [c for _, c in evs]
    p = BucketParams(rate_milli, burst_nano)
    _, admitted = trajectory(times, costs, p)
    assert count(times, costs, p).rejected == admitted.count(False)
    z = zero_refusal_burst(times, costs, rate_milli)
    assert count(times, costs, BucketParams(rate_milli, max(1, z))).rejected == 0
    if z > 1:
        assert count(times, costs, BucketParams(rate_milli, z - 1)).rejected > 0


# -- the frontier against a linear scan of bursts with the rational model --

@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("key,unit", [("tenant", "requests"), ("global", "requests"), ("cluster", "tokens")])
def test_smallest_burst_is_the_brute_force_minimum(name, key, unit):
    """Requests: every burst from 1 up. Tokens (bursts in the thousands): the 150 below the answer."""
    rows = ALL[name](800)
    series = _trace(rows).series(key, unit)
    for value, s in sorted(series.items())[:2]:
        times, costs = _fr(s)
        for rate in auto_rates(s, 4)[:3]:
            p = smallest_burst(s, rate, 0.02)
            assert p.burst is not None
            start = 1 if unit == "requests" else p.burst - 150
            want = bf.smallest_burst_scan(times, costs, F(str(rate)), 0.02, start=start)
            assert p.burst == want, (name, value, rate)
            assert p.rejected == bf.refusals(times, costs, F(str(rate)), F(want))


def test_max_wait_constrains_the_burst():
    s = _trace(ALL["noisy"](1500)).series("tenant", "requests")["noisy"]
    free, capped = smallest_burst(s, 1.0, 0.5), smallest_burst(s, 1.0, 0.5, max_wait_s=0.5)
    assert capped.burst >= free.burst
    assert capped.max_wait_s is None or capped.rejected == 0 or capped.max_wait_s <= 0.5


def test_pick_rules():
    s = _trace(ALL["bursty"](1500)).series("global", "requests")["*"]
    fr = sweep("*", s, auto_rates(s, 8), 0.01)
    bursts = [p.burst for p in fr.points]
    assert fr.pick is knee(fr.points) and fr.pick in fr.points
    cap = sorted(bursts)[len(bursts) // 2]
    p = under_cap(fr.points, cap)
    assert p is not None and p.burst <= cap
    assert all(q.burst > cap for q in fr.points if q.rate < p.rate)
    assert sweep("*", s, [1.0], 0.01, max_burst=0.5).pick is None


# -- what-if against the brute-force limiter --

@pytest.mark.parametrize("name", sorted(ALL))
@pytest.mark.parametrize("group_by", ["tenant", "cluster", "global"])
def test_whatif_counts_match_brute_force(name, group_by):
    rows = ALL[name](1500)
    w = simulate(_trace(rows), parse_config({"limits": LIMITS}), group_by)
    reqs, refused, bound = bf.whatif(rows, LIMITS, group_by)
    assert {k: t.requests for k, t in w.per_key.items()} == dict(reqs)
    assert {k: t.rejected for k, t in w.per_key.items() if t.rejected} == dict(refused)
    assert dict(w.total.bound_by) == dict(bound)
    assert w.total.rejected > 0 and len(bound) >= 3  # several rules bind


def test_global_breaker_and_tier_rules_bind():
    rows = ALL["diurnal"](1500)
    limits = [*LIMITS[:3], {"scope": "global", "unit": "requests", "rate": 9, "burst": 14}]
    w = simulate(_trace(rows), parse_config({"limits": limits}), "tenant")
    _, refused, bound = bf.whatif(rows, limits, "tenant")
    assert dict(w.total.bound_by) == dict(bound)
    assert bound["global:*:requests"] > 0 and bound["tenant:*[tier=L3]:tokens"] > 0


# -- emitted config: both loaders, and a live limiter refuses as predicted --

@pytest.mark.parametrize("name", sorted(ALL))
async def test_emitted_config_loads_and_limits_as_predicted(name, tmp_path):
    rows = ALL[name](1500)
    trace = _trace(rows)
    series = trace.series("tenant", "requests")
    picks = {}
    for v, s in series.items():
        fr = sweep(v, s, auto_rates(s, 6), 0.02)
        assert fr.pick is not None
        picks[v] = fr.pick
    current = {"enabled": True, "backend": "memory", "limits": LIMITS}
    section = emit.recommended_section(current, "tenant", "requests", picks)
    out = tmp_path / "emitted.yaml"
    out.write_text(emit.render(section))
    loaded = yaml.safe_load(out.read_text())["ratelimit"]
    cfg = parse_config(loaded)
    assert {r.match: (r.rate, r.burst) for r in cfg.limits if r.scope == "tenant" and r.tier is None
            and r.match != "*"} == {v: (p.rate, p.burst) for v, p in picks.items()}
    # the whole modelyard.yaml with this section still loads
    from contracts.config import load_config
    full = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    full["ratelimit"] = loaded
    (tmp_path / "modelyard.yaml").write_text(yaml.safe_dump(full))
    assert load_config(str(tmp_path / "modelyard.yaml")).ratelimit == cfg

    predicted = simulate(trace, cfg, "tenant")
    before = simulate(trace, parse_config(current), "tenant")
    assert predicted.refused != before.refused
    now = [0]
    lim = Limiter(cfg, clock=lambda: now[0])
    refused = []
    for i, ts in enumerate(trace.ts_us):
        now[0] = ts
        c = trace.cols
        d = await lim.acquire(RequestContext(c["tenant"][i], c["tier"][i], c["cluster"][i], c["channel"][i]),
                              trace.tok_nano[i] // NANO)
        refused.append(not d.allowed)
        await lim.reconcile(d.reservation, trace.tok_nano[i] // NANO)
    await lim.close()
    assert refused == predicted.refused


def test_global_key_replaces_the_global_rule():
    s = _trace(ALL["bursty"](500)).series("global", "requests")
    fr = sweep("*", s["*"], [10.0], 0.01)
    sec = emit.recommended_section({"limits": LIMITS}, "global", "requests", {"*": fr.pick})
    g = [r for r in sec["limits"] if r["scope"] == "global"]
    assert g == [{"scope": "global", "unit": "requests", "rate": 10.0, "burst": fr.pick.burst}]
    with pytest.raises(ValueError, match="not a limiter scope"):
        emit.recommended_section({}, "model", "requests", {"m1": fr.pick})


# -- inputs --

def test_legacy_key_cost_trace_and_iso_times():
    t = parse_trace("timestamp,key\n2026-01-01T00:00:01Z,a\n2026-01-01T00:00:00Z,a\n", "csv")
    s = t.series("tenant", "requests")["a"]
    assert s[0][1] - s[0][0] == 1_000_000 and s[1] == [NANO, NANO]
    t = parse_trace('{"timestamp": 1, "key": "x", "cost": 250}\n', "jsonl", key="cluster", unit="tokens")
    assert t.series("cluster", "tokens") == {"x": ([1_000_000], [250 * NANO])}


def test_access_log_lines():
    text = "\n".join([
        '{"time":"2026-01-01T00:00:00.000Z","method":"POST","status":200,"cluster":"demo-openai~failover"}',
        "[2026-01-01 00:00:00] envoy info: not a log line",
        '{"time":"2026-01-01T00:00:00.500Z","method":"POST","status":429,"cluster":"-"}',
        '{"time":"2026-01-01T00:00:01.000Z","method":"POST","status":200,"cluster":"demo-openai"}',
    ])
    t = parse_access_log(text)
    assert len(t) == 3
    assert t.series("cluster", "requests") == {"demo-openai": ([t.ts_us[0], t.ts_us[2]], [NANO, NANO])}
    assert len(t.series("global", "requests")["*"][0]) == 3


_json_val = st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)
_jsonl = st.lists(
    st.dictionaries(st.sampled_from(["timestamp", "key", "cost", "tenant", "tokens", "x"]), _json_val, max_size=4),
    max_size=5).map(lambda rs: "\n".join(json.dumps(r) for r in rs))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | _jsonl, st.sampled_from(["csv", "jsonl"]))
def test_trace_parser_fuzz(text, fmt):
    with contextlib.suppress(TraceError):
        parse_trace(text, fmt)


# -- the command line --

@pytest.fixture
def files(tmp_path):
    rows = ALL["noisy"](1500)
    trace = tmp_path / "trace.csv"
    trace.write_text(csv_text(rows))
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(yaml.safe_dump({"listener": {"port": 1}, "ratelimit": {"backend": "memory", "limits": LIMITS}}))
    return tmp_path, trace, cfg


def test_cli_frontier_whatif_emit_diff(files, capsys):
    tmp, trace, cfg = files
    out_cfg = tmp / "out.yaml"
    assert main(["tune", "--trace", str(trace), "--config", str(cfg), "--emit-config", str(out_cfg), "--diff",
                 "--points", "5"]) == 0
    out = capsys.readouterr().out
    assert "<- recommended" in out and "knee of the frontier" in out
    assert "what-if" in out and "global:*:requests" in out
    assert "+    - {scope: tenant, match: noisy, unit: requests" in out
    cfg2 = parse_config(yaml.safe_load(out_cfg.read_text())["ratelimit"])
    assert any(r.match == "noisy" for r in cfg2.limits)


def test_cli_plots_and_report(files, capsys):
    tmp, trace, _ = files
    svg, png, html = tmp / "p.svg", tmp / "p.png", tmp / "r.html"
    assert main(["--trace", str(trace), "--key", "tenant", "--unit", "tokens", "--points", "4",
                 "--plot", str(svg), "--report", str(html)]) == 0
    root = ET.fromstring(svg.read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    texts = "".join(root.itertext())
    for label in ("bucket level (tokens)", "rate (tokens/s)", "share of seconds above", "time since trace start (s)"):
        assert label in texts
    page = html.read_text()
    assert page.count("<svg") == 6 and "<table>" in page
    assert 'src="http' not in page and 'href="http' not in page  # self-contained: nothing to fetch
    assert main(["--trace", str(trace), "--rate", "5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_metering_db_input(tmp_path, capsys):
    db = tmp_path / "m.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE requests (ts REAL, task_id TEXT, tenant TEXT, tier TEXT, model TEXT, cluster TEXT,"
                     " channel TEXT, status INTEGER, latency_ms REAL, ttft_ms REAL, input_tokens INTEGER,"
                     " output_tokens INTEGER, cost REAL, strategy TEXT, arm TEXT)")
        conn.executemany("INSERT INTO requests (ts, task_id, tenant, tier, model, cluster, channel, input_tokens,"
                         " output_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                         [(100 + i * 0.1, str(i), "t1", "L1", "m", "c", "standard", 10, 5) for i in range(50)])
    # Rows of 1970: outside the default window (the last 7 days), read with --since.
    assert main(["--metering-db", str(db), "--key", "model", "--unit", "tokens", "--rate", "100",
                 "--since", "1970-01-01"]) == 0
    out = capsys.readouterr().out
    assert "model m: 50 requests, 750 tokens" in out


def test_cli_bad_input_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "t.csv"
    bad.write_text("timestamp,key,cost\nyesterday,a,1\n")
    assert main(["--trace", str(bad), "--rate", "1"]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.csv"), "--rate", "1"]) == 2
    assert main(["--trace", str(bad), "--rate", "0"]) == 2
    # No input and no config (the project's own names run/metering.sqlite, which `make up` may have written).
    assert main(["--rate", "1", "--no-config"]) == 2
    good = tmp_path / "g.csv"
    good.write_text("timestamp,key\n1,a\n")
    assert main(["--trace", str(good), "--unit", "tokens"]) == 2
    assert "no token counts" in capsys.readouterr().err
    assert main(["--trace", str(good), "--emit-config", str(tmp_path / "x.yaml"), "--key", "model"]) == 2
