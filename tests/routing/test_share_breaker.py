"""Concentration breakers over groups of models (extproc/routing/share_breaker.py) and how the
scheduler moves a group's calls off the member that took more than its share."""

import pytest

from contracts.config.routing import ShareBreakerSettings
from contracts.errors import ConfigError
from extproc.routing import RouteRequest, Scheduler
from extproc.routing.explain import explain, hold_share_trips
from extproc.routing.share_breaker import ShareBreaker

from .conftest import dep, make_config, model

AB = ("a", "b")


def _b(**kw) -> ShareBreaker:
    s = ShareBreakerSettings(models=["a", "b"], **{"window_s": 10, "min_calls": 4, "max_share": 0.6, "open_s": 5,
                                                    **kw})
    return ShareBreaker(s, frozenset(s.models or ()))


def test_trips_past_max_share_with_enough_calls_and_heals_when_the_share_falls():
    b = _b()
    assert [b.routed("a", t, "", AB) for t in range(3)] == [None] * 3  # 3 of 3, under min_calls
    trip = b.routed("a", 3, "", AB)
    assert trip is not None and (trip.label, trip.member, trip.calls, trip.share) == ("share:a+b:a", "a", 4, 1.0)
    assert b.skips("a", 3.5) and not b.skips("b", 3.5) and b.trips == 1
    assert b.routed("a", 3.6, "", AB) is None  # served while tripped (nothing else could): no second trip
    for t in (4, 4.5, 5, 5.5):
        b.routed("b", t, "", AB)
    assert b.share("a", 6) == pytest.approx(5 / 9)  # under max_share, but open_s not over
    assert b.skips("a", 7.9)
    assert not b.skips("a", 8.1) and b.tripped == {}  # 5 s after the trip, share 56%: healed


def test_stays_tripped_past_open_s_while_the_share_is_still_high():
    b = _b()
    for t in range(4):
        b.routed("a", t, "", AB)
    b.routed("b", 4, "", AB)
    assert b.skips("a", 9)  # open_s over, yet a still has 4 of 5 calls
    assert not b.skips("a", 13.5)  # the window slid past the old calls: too few to judge


def test_only_calls_routed_among_two_members_count():
    b = _b()
    assert all(b.routed("c", t, "", ("a", "c")) is None for t in range(10))  # not a member
    assert all(b.routed("a", t, "", ("a", "c")) is None for t in range(10))  # no choice among the group
    assert len(b.window) == 0


def test_settings_name_one_group():
    with pytest.raises(ValueError, match="exactly one of"):
        ShareBreakerSettings(group="g", models=["a", "b"])
    with pytest.raises(ValueError, match="at least two"):
        ShareBreakerSettings(models=["a", "a"])


@pytest.fixture
def cheap_and_dear():
    return make_config([model("cheap", [dep("c1", monitored=False)], groups=["g"], cost={"input_per_1k": 0.01}),
                        model("dear", [dep("d1", monitored=False)], groups=["g"], cost={"input_per_1k": 1.0})],
                       routing={"share_breakers": [{"group": "g", "window_s": 30, "min_calls": 4, "max_share": 0.6,
                                                    "open_s": 2}]})


def test_the_cost_strategy_piles_onto_the_cheap_model_until_its_share_trips(cheap_and_dear):
    s = Scheduler(cheap_and_dear)
    t = cheap_and_dear.tenants[0]
    picks, trips = [], []
    for i in range(8):
        d = s.decide(RouteRequest("g", t, "cost"), 100 + i * 0.1, {})
        picks.append(d.chosen.model)
        trips += [x.label for x in d.share_trips]
    # the 4th call trips cheap (4 of 4); the group's next calls go to dear until cheap's share is 4 of 7 <= 60%
    assert picks == ["cheap"] * 4 + ["dear"] * 4
    assert trips == ["share:g:cheap"]
    d = s.decide(RouteRequest("g", t, "cost"), 100.5, {})
    assert d.chosen.model == "dear" and [r.check for r in d.rejected] == ["share"]
    assert d.rejected[0].reason.startswith("share breaker g: cheap took 50% of 8 calls in 30s (max 60%; 1.8s left)")
    assert s.learning_state(100.5)[1] == {"share:g:cheap": 1, "share:g:dear": 0}
    # a dry run (route explain) shows the skip and counts nothing
    n = len(s.shares.all[0].window)
    assert s.decide(RouteRequest("g", t, "cost"), 100.6, {}, dry_run=True).chosen.model == "dear"
    assert len(s.shares.all[0].window) == n
    # past open_s with its share under max, cheap is back
    assert s.decide(RouteRequest("g", t, "cost"), 102.5, {}).chosen.model == "cheap"
    assert s.learning_state(102.5)[1]["share:g:cheap"] == 0


def test_a_tripped_member_still_serves_when_nothing_else_can(cheap_and_dear):
    s = Scheduler(cheap_and_dear)
    t = cheap_and_dear.tenants[0]
    for i in range(4):
        s.decide(RouteRequest("g", t, "cost"), 100 + i * 0.1, {})
    n = len(s.shares.all[0].window)
    d = s.decide(RouteRequest("cheap", t, "cost"), 100.5, {})  # asked by name: the only member that may serve
    assert d.chosen.model == "cheap" and d.rejected == ()
    assert len(s.shares.all[0].window) == n  # and no choice among the group: not counted


def test_a_reload_keeps_a_tripped_breaker_and_unknown_names_warn(cheap_and_dear, caplog):
    s = Scheduler(cheap_and_dear)
    t = cheap_and_dear.tenants[0]
    for i in range(4):
        s.decide(RouteRequest("g", t, "cost"), 100 + i * 0.1, {})
    s2 = Scheduler(cheap_and_dear)
    s2.carry_learning(s)
    assert s2.decide(RouteRequest("g", t, "cost"), 100.5, {}).chosen.model == "dear"
    Scheduler(make_config([model("m", [dep("m1")])], routing={"share_breakers": [{"group": "nope"},
                                                                                  {"models": ["m", "x"]}]}))
    assert "routing.share_breakers[0].group: 'nope' is no model group" in caplog.text
    assert "routing.share_breakers[1].models[1]: 'x' is not defined" in caplog.text


def test_a_group_breaker_counts_only_calls_asking_for_the_group():
    cfg = make_config([model("cheap", [dep("c1", monitored=False)], groups=["g"], cost={"input_per_1k": 0.01}),
                       model("dear", [dep("d1", monitored=False)], groups=["g"], cost={"input_per_1k": 1.0})],
                      routing={"share_breakers": [{"group": "g", "min_calls": 2, "max_share": 0.5}]})
    s = Scheduler(cfg)
    t = cfg.tenants[0]
    # `auto` resolves to the same two models, but it is not the group's name: nothing counted
    assert [s.decide(RouteRequest("auto", t, "cost"), 1 + i, {}).chosen.model for i in range(5)] == ["cheap"] * 5
    assert len(s.shares.all[0].window) == 0
    assert [s.decide(RouteRequest("g", t, "cost"), 10 + i, {}).chosen.model for i in range(3)] == \
        ["cheap", "cheap", "dear"]
    # tripped, the member is skipped for any call that has another model to go to
    assert s.decide(RouteRequest("auto", t, "cost"), 13, {}).chosen.model == "dear"


def test_auto_is_a_group_too():
    cfg = make_config([model("cheap", [dep("c1", monitored=False)], cost={"input_per_1k": 0.01}),
                       model("dear", [dep("d1", monitored=False)], cost={"input_per_1k": 1.0})],
                      routing={"share_breakers": [{"group": "auto", "min_calls": 2, "max_share": 0.5}]})
    s = Scheduler(cfg)
    t = cfg.tenants[0]
    assert [s.decide(RouteRequest("auto", t, "cost"), 1 + i, {}).chosen.model for i in range(3)] == \
        ["cheap", "cheap", "dear"]
    with pytest.raises(ConfigError):
        make_config([model("m", [dep("m1")])], routing={"share_breakers": [{"group": "g", "max_share": 1.0}]})



def test_route_explain_shows_the_skip_and_live_reads_the_trip_from_metrics(cheap_and_dear):
    s = Scheduler(cheap_and_dear)
    t = cheap_and_dear.tenants[0]
    for i in range(4):
        s.decide(RouteRequest("g", t, "cost"), 100 + i * 0.1, {})
    doc = explain(s, RouteRequest("g", t, "cost"), 100.5, {})
    assert doc["chosen"] == "d1"
    assert [r["filtered"] for r in doc["rows"] if r["rank"] is None] == \
        ["share breaker g: cheap took 100% of 4 calls in 30s (max 60%; 1.8s left)"]
    # `route explain --live`: a fresh scheduler learns the trip from the running extproc's /metrics
    live = Scheduler(cheap_and_dear)
    hold_share_trips(live, 'modelyard_breaker_state{group="share:g:cheap"} 1.0\n'
                           'modelyard_breaker_state{group="share:g:dear"} 0.0\n')
    doc = explain(live, RouteRequest("g", t, "cost"), 1, {})
    assert doc["chosen"] == "d1" and doc["rows"][-1]["filtered"] == \
        "share breaker g: cheap tripped (as the running extproc reports)"
