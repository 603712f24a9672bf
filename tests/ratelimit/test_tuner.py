"""The burst tuner on generated traces."""

import json
import random
import xml.etree.ElementTree as ET

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from ratelimit.bucket import NANO, BucketParams
from ratelimit.tuner import TraceError, main, parse_trace, recommend, replay


def _trace(n=1500, seed=3):
    rng = random.Random(seed)
    t, rows = 1_700_000_000.0, []
    for _ in range(n):
        t += rng.expovariate(4) if rng.random() < 0.9 else rng.expovariate(40)  # bursty
        rows.append((t, rng.choice(["tenant-a", "tenant-b"]), rng.randint(1, 4)))
    return rows


def test_recommended_burst_meets_target_and_is_smallest(tmp_path):
    rows = _trace()
    p = tmp_path / "trace.csv"
    p.write_text("timestamp,key,cost\n" + "".join(f"{t:.6f},{k},{c}\n" for t, k, c in rows))
    trace = parse_trace(p.read_text(), "csv")
    for key, evs in trace.items():
        rec = recommend(key, evs, rate=6, target=0.02)
        allowed = int(0.02 * len(evs))
        assert replay(evs, BucketParams(6000, rec.burst * NANO)) <= allowed
        assert rec.burst == 1 or replay(evs, BucketParams(6000, (rec.burst - 1) * NANO)) > allowed


def test_cli_table_and_svg(tmp_path, capsys):
    p = tmp_path / "trace.jsonl"
    p.write_bytes(b"".join(orjson.dumps({"timestamp": t, "key": k, "cost": c}) + b"\n" for t, k, c in _trace(400)))
    svg = tmp_path / "out.svg"
    assert main(["tune", "--trace", str(p), "--rate", "5", "--target", "0.01", "--plot", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "tenant-a" in out and "tenant-b" in out and "burst" in out
    root = ET.fromstring(svg.read_text())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.findall(".//{http://www.w3.org/2000/svg}polyline")
    png = tmp_path / "out.png"
    assert main(["--trace", str(p), "--rate", "5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_input_is_an_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "t.csv"
    bad.write_text("timestamp,key,cost\nyesterday,a,1\n")
    assert main(["--trace", str(bad), "--rate", "1"]) == 2
    assert "line 2" in capsys.readouterr().err
    assert main(["--trace", str(tmp_path / "missing.csv"), "--rate", "1"]) == 2
    assert main(["--trace", str(bad), "--rate", "0"]) == 2
    assert main(["--rate", "1"]) == 2


def test_iso_timestamps():
    t = parse_trace("timestamp,key\n2026-01-01T00:00:01Z,a\n2026-01-01T00:00:00Z,a\n", "csv")
    assert t["a"][1][0] - t["a"][0][0] == 1_000_000 and t["a"][0][1] == NANO


_json_val = st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2)
_jsonl = st.lists(
    st.dictionaries(st.sampled_from(["timestamp", "key", "cost", "x"]), _json_val, max_size=4), max_size=5
).map(lambda rs: "\n".join(json.dumps(r) for r in rs))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200) | _jsonl, st.sampled_from(["csv", "jsonl"]))
def test_trace_parser_fuzz(text, fmt):
    try:
        parse_trace(text, fmt)
    except TraceError:
        pass
