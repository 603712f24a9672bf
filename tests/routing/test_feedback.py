"""EWMA feedback into the score, cooldowns and recovery."""

import pytest

from contracts.config.routing import CooldownSettings, FeedbackSettings
from extproc.routing import RouteRequest, Scheduler, parse_routing_settings
from extproc.routing.feedback import Feedback

from .conftest import dep, fresh, make_config, model


@pytest.fixture
def pair():
    return make_config([model("m", [dep("m1"), dep("m2")], latency_ms=500)])


def test_ewma_values():
    f = Feedback(FeedbackSettings(alpha=0.5), CooldownSettings())
    f.record("c", 1.0, True, ttft_s=0.2, now=0)
    f.record("c", 3.0, True, ttft_s=0.4, now=1)
    s = f.get("c")
    assert s.latency_s == pytest.approx(2.0) and s.latency_n == 2
    assert s.ttft_s == pytest.approx(0.3) and s.ttft_n == 2
    f.record("c", 9.0, False, now=2)
    assert s.latency_s == pytest.approx(2.0)  # a failure's latency is not a serving time
    assert s.error_rate == pytest.approx(0.5)
    f.record("c", 1.0, True, now=3)
    assert s.error_rate == pytest.approx(0.25)


def test_observed_latency_moves_traffic(pair):
    s = Scheduler(pair)
    t = pair.tenants[0]
    assert s.decide(RouteRequest("m", t, "speed"), 100, fresh(pair)).chosen.cluster == "m1"
    for i in range(10):
        s.record("m1", 2.0, True, now=100 + i)
        s.record("m2", 0.1, True, now=100 + i)
    d = s.decide(RouteRequest("m", t, "speed"), 120, fresh(pair, now=120))
    assert [c.cluster for c in d.candidates] == ["m2", "m1"]
    # Blended with the 0.5 s prior counted as 5 samples: (0.5*5 + 2.0*10) / 15.
    assert d.candidates[1].terms["latency_s"] == pytest.approx(1.5)


def test_streams_use_time_to_first_token(pair):
    s = Scheduler(pair)
    t = pair.tenants[0]
    for i in range(20):
        s.record("m1", 0.3, True, ttft_s=2.0, now=i)  # quick overall, slow to start
        s.record("m2", 1.0, True, ttft_s=0.05, now=i)
    marks = fresh(pair, now=30)
    assert s.decide(RouteRequest("m", t, "speed"), 30, marks).chosen.cluster == "m1"
    assert s.decide(RouteRequest("m", t, "speed", stream=True), 30, marks).chosen.cluster == "m2"


def test_error_rate_lowers_the_score(pair):
    s = Scheduler(pair)
    t = pair.tenants[0]
    s.record("m1", 0.5, False, now=0)
    d = s.decide(RouteRequest("m", t), 100, fresh(pair))
    assert d.chosen.cluster == "m2"
    assert d.candidates[1].terms["error_rate"] == pytest.approx(0.2)


def test_cooldown_and_recovery(pair):
    settings = parse_routing_settings({"cooldown": {"failures": 3, "window_s": 10, "cooldown_s": 30}})
    s = Scheduler(pair, settings)
    t = pair.tenants[0]
    s.record("m1", 0.1, False, now=100)
    s.record("m1", 0.1, False, now=101)
    assert s.feedback.cooling_until("m1", 101) is None  # two failures: not yet
    s.record("m1", 0.1, False, now=102)
    assert s.feedback.cooling_until("m1", 102) == 132
    d = s.decide(RouteRequest("m", t), 110, fresh(pair, now=110))
    assert [c.cluster for c in d.candidates] == ["m2"]
    assert d.rejected[0].reason.startswith("cooling down")
    # Both cooling: no outage. Both serve again (panic routing), and the decision says so.
    for i in range(3):
        s.record("m2", 0.1, False, now=111 + i)
    d = s.decide(RouteRequest("m", t), 115, fresh(pair, now=115))
    assert sorted(c.cluster for c in d.candidates) == ["m1", "m2"] and d.fail_open == ("cooldown",)
    assert not any(r.check == "cooldown" for r in d.rejected)
    # After the cooldown m1 is tried again; one more failure does not send it straight back.
    d = s.decide(RouteRequest("m", t), 132.5, fresh(pair, now=132.5))
    assert "m1" in [c.cluster for c in d.candidates]
    s.record("m1", 0.1, False, now=133)
    assert s.feedback.cooling_until("m1", 133) is None


def test_failures_outside_the_window_do_not_add_up(pair):
    s = Scheduler(pair, parse_routing_settings({"cooldown": {"failures": 2, "window_s": 5}}))
    s.record("m1", 0.1, False, now=0)
    s.record("m1", 0.1, False, now=6)
    assert s.feedback.cooling_until("m1", 6) is None
    s.record("m1", 0.1, False, now=7)
    assert s.feedback.cooling_until("m1", 7) is not None


def test_success_resets_the_failure_count(pair):
    s = Scheduler(pair, parse_routing_settings({"cooldown": {"failures": 2}}))
    s.record("m1", 0.1, False, now=0)
    s.record("m1", 0.1, True, now=1)
    s.record("m1", 0.1, False, now=2)
    assert s.feedback.cooling_until("m1", 2) is None
