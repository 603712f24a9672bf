"""Benchmarks' status accounting: which outcomes fail a case, and what wrk's report turns into."""

from __future__ import annotations

import pytest

from bench.outcomes import Tally, format_counts, report
from bench.wrk_load import parse_wrk, post_script

WRK_HEAD = """Running 2s test @ http://127.0.0.1:1/v1/chat/completions
  1 threads and 16 connections
  Latency Distribution
     50%    7.52ms
     75%    9.10ms
     90%   12.00ms
     99%   18.16ms
  4060 requests in 2.00s, 1.2MB read
Requests/sec:   2030.00
"""


def _wrk(statuses: str, errors: str = "connect=0 read=0 write=0 timeout=0 status=0", requests: int = 4060) -> str:
    return WRK_HEAD + (f"MODELYARD-WRK-STATUSES{statuses}\nMODELYARD-WRK-ERRORS {errors}\n"
                       f"MODELYARD-WRK-RUN duration_us=2000000 requests={requests}\n")


def test_all_200_passes_and_counts_throughput_from_them() -> None:
    run = parse_wrk(_wrk(" 200=4060"), Tally("gateway", "modelyard c=16"))
    assert run.tally.failure() is None
    assert run.ok_rps == pytest.approx(2030.0)
    assert (run.p50_ms, run.p99_ms) == (7.52, 18.16)


def test_fast_503s_fail_the_case_and_are_not_throughput() -> None:
    out = _wrk(" 200=60 503=4000", "connect=0 read=0 write=0 timeout=0 status=4000")
    run = parse_wrk(out, Tally("gateway", "modelyard c=16 round 2"))
    assert run.ok_rps == pytest.approx(30.0)
    assert run.tally.failure() == "FAILED: gateway modelyard c=16 round 2: 4000 requests got 503 x4000"


def test_socket_errors_fail_the_case() -> None:
    out = _wrk(" 200=4050", "connect=0 read=3 write=0 timeout=2 status=0", requests=4050)
    run = parse_wrk(out, Tally("gateway", "bare-envoy c=16"))
    assert run.tally.unexpected == {"read error": 3, "timeout error": 2}
    assert run.tally.failure() == "FAILED: gateway bare-envoy c=16: 5 requests got read error x3, timeout error x2"


def test_output_without_the_script_report_fails() -> None:
    run = parse_wrk(WRK_HEAD, Tally("gateway", "modelyard c=1"))
    assert run.tally.unexpected == {"no wrk report": 1}
    assert run.ok_rps == 0.0


def test_responses_the_script_did_not_see_fail() -> None:
    run = parse_wrk(_wrk(" 200=4000"), Tally("gateway", "modelyard c=1"))
    assert run.tally.unexpected == {"uncounted response": 60}


def test_declared_statuses_pass_per_case() -> None:
    limited = Tally("ratelimit", "over the limit", frozenset({200, 429}))
    limited.add(200, 10)
    limited.add(429, 90)
    assert limited.failure() is None and limited.ok == 100
    strict = Tally("ratelimit", "under the limit")
    strict.add(200, 10)
    strict.add(429, 1)
    assert strict.failure() == "FAILED: ratelimit under the limit: 1 requests got 429 x1"


def test_report_prints_every_failure_and_returns_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    good, bad = Tally("b", "good"), Tally("b", "bad")
    good.add(200, 5)
    bad.add(200, 5)
    bad.add("ConnectError", 2)
    bad.add(502)
    assert report([good]) == 0
    assert report([good, bad]) == 1
    assert capsys.readouterr().out == "FAILED: b bad: 3 requests got 502 x1, ConnectError x2\n"


def test_counts_order_statuses_numerically_then_named_errors() -> None:
    assert format_counts({"read error": 1, 503: 2, 404: 3}) == "404 x3, 503 x2, read error x1"


def test_post_script_quotes_body_and_headers_for_lua() -> None:
    lua = post_script('{"a":"it\'s é\\n"}', {"Authorization": "Bearer k"})
    # Lua 5.1 decimal escapes: a quote is 34, a backslash 92, é is UTF-8 195 169.
    assert 'wrk.body = "{\\034a\\034:\\034it\'s \\195\\169\\092n\\034}"' in lua
    assert 'wrk.headers["Authorization"] = "Bearer k"' in lua
    assert "function response(status" in lua and "function done(" in lua
