"""EWMA feedback into the score, cooldowns and recovery."""

import pytest

from contracts.config.routing import CooldownSettings, FeedbackSettings
from contracts.errors import ConfigError
from extproc.routing import RouteRequest, Scheduler, parse_routing_settings
from extproc.routing.feedback import Feedback

from .conftest import dep, fresh, make_config, model


@pytest.fixture
def pair():
    return make_config([model("m", [dep("m1"), dep("m2")], latency_ms=500)])


def test_ewma_values():
    f = Feedback(FeedbackSettings(alpha=0.5, half_life_s=None), CooldownSettings())
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
    s = Scheduler(pair, parse_routing_settings({"feedback": {"half_life_s": None}}))  # exact blend, no decay
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


def test_error_rate_lowers_the_score_after_consecutive_failures(pair):
    s = Scheduler(pair, parse_routing_settings({"feedback": {"consecutive_failures": 3},
                                                "cooldown": {"failures": 99}}))
    t = pair.tenants[0]
    for i in range(2):
        s.record("m1", 0.5, False, now=100 + i)
        d = s.decide(RouteRequest("m", t), 100 + i, fresh(pair))
        assert d.chosen.cluster == "m1" and d.candidates[0].terms["error_rate"] == 0.0  # not yet evidence
    s.record("m1", 0.5, False, now=102)
    d = s.decide(RouteRequest("m", t), 102, fresh(pair))
    assert d.chosen.cluster == "m2"
    assert d.candidates[1].terms["error_rate"] == pytest.approx(s.feedback.get("m1").error_rate)  # the EWMA, whole


def test_one_failure_does_not_move_a_deployment_by_default(pair):
    s = Scheduler(pair)
    t = pair.tenants[0]
    s.record("m1", 0.5, False, now=100)
    assert s.feedback.get("m1").error_rate == pytest.approx(0.2)  # the EWMA (metrics) still sees it
    assert s.decide(RouteRequest("m", t), 100, fresh(pair)).chosen.cluster == "m1"


def test_a_success_breaks_the_streak(pair):
    s = Scheduler(pair, parse_routing_settings({"feedback": {"consecutive_failures": 2}, "cooldown": {"failures": 99}}))
    t = pair.tenants[0]
    for i, ok in enumerate((False, True, False, True, False)):
        s.record("m1", 0.5, ok, now=100 + i)
    assert s.decide(RouteRequest("m", t), 105, fresh(pair)).chosen.cluster == "m1"
    s.record("m1", 0.5, False, now=105)
    assert s.decide(RouteRequest("m", t), 105, fresh(pair)).chosen.cluster == "m2"


def test_one_failure_among_many_successes_is_its_share():
    f = Feedback(FeedbackSettings(half_life_s=None, min_samples=20), CooldownSettings(failures=99))
    for i in range(999):
        f.record("c", 0.1, True, now=i)
    f.record("c", 0.1, False, now=999)
    assert f.get("c").error_rate == pytest.approx(0.2)  # what the EWMA alone would have scored
    assert f.view("", 999).get("c").error_rate == pytest.approx(1 / 1000)


def test_enough_samples_are_evidence_without_a_streak():
    """Every other call failing: no streak of two, yet half of twenty recent outcomes failed."""
    f = Feedback(FeedbackSettings(half_life_s=None, consecutive_failures=2, min_samples=20), CooldownSettings(failures=99))
    for i in range(19):
        f.record("c", 0.1, i % 2 == 0, now=i)
    assert f.view("", 19).get("c").error_rate == 0.0  # 19 outcomes: not yet
    f.record("c", 0.1, False, now=19)
    assert f.view("", 19).get("c").error_rate == pytest.approx(0.5)  # min(EWMA, share 10/20)


def test_recent_outcomes_decay_with_the_half_life():
    f = Feedback(FeedbackSettings(half_life_s=10, consecutive_failures=99, min_samples=20), CooldownSettings(failures=99))
    for i in range(30):
        f.record("c", 0.1, i % 3 != 0, now=0)
    assert f.view("", 0).get("c").error_rate > 0
    assert f.view("", 10).get("c").error_rate == 0.0  # 15 outcomes' weight left: below min_samples


def test_evidence_settings_have_defaults_and_bounds():
    fb = parse_routing_settings({}).feedback
    assert (fb.consecutive_failures, fb.min_samples) == (5, 20)
    with pytest.raises(ConfigError, match="routing.feedback.consecutive_failures"):
        parse_routing_settings({"feedback": {"consecutive_failures": 0}})


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


def test_error_rate_heals_with_time_without_traffic(pair):
    """Nobody routes to a deployment whose score fell, so only time can bring it back."""
    s = Scheduler(pair, parse_routing_settings({"feedback": {"half_life_s": 10, "consecutive_failures": 3},
                                                "cooldown": {"failures": 99}}))
    t = pair.tenants[0]
    for i in range(3):
        s.record("m1", 0.5, False, now=100 + i, tenant=t.name)
    d = s.decide(RouteRequest("m", t), 103, fresh(pair, now=103))
    assert d.chosen.cluster == "m2"
    err = d.candidates[1].terms["error_rate"]
    later = s.decide(RouteRequest("m", t), 123, fresh(pair, now=123))  # two half-lives on
    assert later.candidates[[c.cluster for c in later.candidates].index("m1")].terms["error_rate"] == \
        pytest.approx(err / 4, rel=0.05)
    back = s.decide(RouteRequest("m", t), 200, fresh(pair, now=200))
    assert back.chosen.cluster == "m1"  # config order breaks the tie again once the error has faded


def test_observed_latency_fades_back_to_the_prior(pair):
    s = Scheduler(pair, parse_routing_settings({"feedback": {"half_life_s": 5}}))
    t = pair.tenants[0]
    for i in range(10):
        s.record("m1", 5.0, True, now=i)
    slow = s.decide(RouteRequest("m", t, "speed"), 10, fresh(pair, now=10))
    assert slow.chosen.cluster == "m2"
    healed = s.decide(RouteRequest("m", t, "speed"), 200, fresh(pair, now=200))
    m1 = healed.candidates[[c.cluster for c in healed.candidates].index("m1")]
    assert m1.terms["latency_s"] == pytest.approx(0.5, rel=0.01)  # the configured 500 ms again


def _tenants(cfg):
    a, b = cfg.tenants[0], cfg.tenants[0].model_copy(update={"name": "other"})
    return a, b


def test_one_tenants_failures_do_not_steer_others_once_contradicted(pair):
    s = Scheduler(pair, parse_routing_settings({"cooldown": {"failures": 3, "window_s": 60, "cooldown_s": 30}}))
    bad, good = _tenants(pair)
    s.record("m1", 0.5, True, now=100, tenant=good.name)  # another tenant is served well here
    for i in range(3):
        s.record("m1", 0.5, False, now=101 + i, tenant=bad.name)
    assert s.feedback.cooling_until("m1", 104) is None  # no cooldown for everyone
    marks = fresh(pair, now=104)
    assert s.decide(RouteRequest("m", good), 104, marks).chosen.cluster == "m1"
    d = s.decide(RouteRequest("m", bad), 104, marks)
    assert [c.cluster for c in d.candidates] == ["m2"]  # its own cooldown
    assert d.rejected[0].check == "cooldown"


def test_uncontradicted_failures_count_for_everyone(pair):
    """An upstream that is down: one tenant's failures with nobody else's successes cool it for all."""
    s = Scheduler(pair, parse_routing_settings({"cooldown": {"failures": 3, "window_s": 60, "cooldown_s": 30}}))
    bad, good = _tenants(pair)
    for i in range(3):
        s.record("m1", 0.5, False, now=100 + i, tenant=bad.name)
    assert s.feedback.cooling_until("m1", 103) == 132
    assert s.decide(RouteRequest("m", good), 103, fresh(pair, now=103)).chosen.cluster == "m2"


def test_two_tenants_failing_move_everyone(pair):
    s = Scheduler(pair, parse_routing_settings({"cooldown": {"failures": 99}}))
    a, b = _tenants(pair)
    third = a.model_copy(update={"name": "third"})
    s.record("m1", 0.5, True, now=99, tenant=third.name)
    for i in range(3):
        s.record("m1", 0.5, False, now=100 + i, tenant=a.name)
        s.record("m1", 0.5, False, now=100 + i, tenant=b.name)
    d = s.decide(RouteRequest("m", third), 103, fresh(pair, now=103))
    assert d.chosen.cluster == "m2"
    assert d.candidates[1].terms["error_rate"] > 0.4
