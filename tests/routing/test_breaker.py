"""Total breakers over groups (extproc/routing/breaker.py) and how the scheduler routes around them."""

import pytest

from contracts.config.routing import GroupBreakerSettings
from contracts.errors import ConfigError
from extproc.routing import NoCapacity, RouteRequest, Scheduler
from extproc.routing.breaker import GroupBreaker

from .conftest import dep, make_config, model


def _b(**kw) -> GroupBreaker:
    return GroupBreaker(GroupBreakerSettings(model="m", **{"window_s": 10, "min_calls": 4, "error_rate": 0.5,
                                                           "open_s": 5, "probes": 2, **kw}))


def test_trips_at_the_error_rate_with_enough_calls():
    b = _b()
    assert not b.record(False, 0) and not b.record(False, 1)  # 2 of 2 failed, under min_calls
    assert not b.record(True, 2)
    assert b.record(False, 3)  # 3 of 4 >= 0.5
    assert b.current(3) == "open" and not b.admits(4) and b.retry_after(4) == pytest.approx(4)


def test_old_outcomes_leave_the_window():
    b = _b()
    for t in range(3):
        b.record(False, t)
    assert not b.record(True, 20)  # the failures are 17+ s old: one call in the window
    assert b.current(20) == "closed"


def test_half_open_probes_close_it_or_open_it_again():
    b = _b()
    for t in range(4):
        b.record(False, t)
    assert b.current(7.9) == "open"  # tripped at 3, open_s 5
    assert b.admits(9) and b.current(9) == "half_open"
    b.routed(9)
    b.routed(9)
    assert not b.admits(9)  # both probes out
    b.record(True, 9.5)
    assert b.current(9.6) == "half_open"
    b.record(True, 9.7)
    assert b.current(9.8) == "closed" and b.admits(9.8)
    for t in range(4):
        b.record(False, 10 + t)
    b.current(19)
    b.routed(19)
    assert b.record(False, 19.2) and b.current(19.3) == "open" and b.trips == 3


def test_a_probe_that_never_reports_is_replaced():
    b = _b(probes=1)
    for t in range(4):
        b.record(False, t)
    b.current(9)
    b.routed(9)
    assert not b.admits(10)
    assert b.admits(14.1)  # open_s after the lost probe: another goes


@pytest.fixture
def group():
    return make_config([model("m", [dep("m1", monitored=False), dep("m2", monitored=False)], groups=["g"],
                              quality=0.9),
                        model("n", [dep("n1", monitored=False)], groups=["g"], quality=0.1)],
                       routing={"breakers": [{"model": "m", "window_s": 10, "min_calls": 4, "error_rate": 0.5,
                                              "open_s": 5, "probes": 1}],
                                "cooldown": {"failures": 100}})


def test_an_open_model_breaker_spills_the_group_and_fails_the_model_fast(group):
    s = Scheduler(group)
    t = group.tenants[0]
    assert s.decide(RouteRequest("g", t, "quality"), 100, {}).chosen.model == "m"
    tripped = []
    for i in range(4):  # both deployments fail together: each alone is far from its cooldown
        tripped += s.record("m1" if i % 2 else "m2", 0.1, False, now=100 + i * 0.1)
    assert [b.group for b in tripped] == ["model:m"]
    d = s.decide(RouteRequest("g", t, "quality"), 101, {})
    assert d.chosen.model == "n"  # the group spills to the other model
    assert {r.check for r in d.rejected} == {"breaker"}
    with pytest.raises(NoCapacity) as e:
        s.decide(RouteRequest("m", t, "quality"), 101, {})
    assert e.value.retry_after_s == pytest.approx(4.3, abs=0.01)
    assert "group breaker model:m open" in str(e.value)
    # half-open after open_s: one probe goes to m, the next call spills until it answers
    assert s.decide(RouteRequest("g", t, "quality"), 105.5, {}).chosen.model == "m"
    assert s.decide(RouteRequest("g", t, "quality"), 105.6, {}).chosen.model == "n"
    s.record("m1", 0.1, True, now=105.7)
    assert s.decide(RouteRequest("g", t, "quality"), 105.8, {}).chosen.model == "m"
    assert s.breakers.states(105.8) == {"model:m": "closed"}


def test_a_channel_breaker_covers_every_model_on_it():
    cfg = make_config([model("a", [dep("a1", monitored=False), dep("a-fast", channel="fast", monitored=False)]),
                       model("b", [dep("b-fast", channel="fast", monitored=False)])],
                      routing={"breakers": [{"channel": "fast", "min_calls": 2, "error_rate": 0.5}]})
    s = Scheduler(cfg)
    s.record("a-fast", 0.1, False, now=1)
    assert [b.group for b in s.record("b-fast", 0.1, False, now=1.1)] == ["channel:fast"]
    t = cfg.tenants[0]
    d = s.decide(RouteRequest("a", t, want_fast=True), 2, {})
    assert d.chosen.cluster == "a1"  # the fast call is served on the standard channel


def test_a_breaker_names_one_group(caplog):
    with pytest.raises(ConfigError, match="exactly one of"):
        make_config([model("m", [dep("m1")])], routing={"breakers": [{"model": "m", "channel": "fast"}]})
    s = Scheduler(make_config([model("m", [dep("m1")])], routing={"breakers": [{"model": "x"}]}))
    assert "routing.breakers[0].model: 'x' is not defined" in caplog.text
    assert s.breakers.by_cluster == {}  # inert
