"""Fast-channel admission: tiers x watermarks, the L3 trial quota, silent downgrade."""

import pytest

from extproc.routing import RouteRequest, Scheduler, parse_routing_settings

from .conftest import dep, fresh, make_config, model, tenant, tenant_of

NOW = 1000.0

# (tier, watermark of the fast deployment, served fast?)
TABLE = [
    ("L1", 0.0, True),
    ("L1", 0.5, True),
    ("L1", 0.89, True),
    ("L1", 0.9, False),  # saturated: no one gets it
    ("L2", 0.0, True),
    ("L2", 0.69, True),
    ("L2", 0.7, False),
    ("L2", 0.85, False),
    ("L3", 0.0, True),
    ("L3", 0.39, True),
    ("L3", 0.4, False),
    ("L3", 0.6, False),
]


@pytest.mark.parametrize("tier, wm, fast", TABLE)
def test_admission_table(two_models, tier, wm, fast):
    name = {"L1": "gold", "L2": "silver", "L3": "bronze"}[tier]
    s = Scheduler(two_models)
    req = RouteRequest("big", tenant_of(two_models, name), want_fast=True)
    d = s.decide(req, NOW, fresh(two_models, now=NOW, overrides={"big-fast": wm}))
    assert d.channel == ("fast" if fast else "standard")
    assert d.chosen.cluster == ("big-fast" if fast else "big-a")
    assert d.downgraded is (not fast)
    if fast:
        # The standard deployment stays in line for failover.
        assert [c.cluster for c in d.candidates] == ["big-fast", "big-a"]


@pytest.mark.parametrize("name", ["gold", "silver", "bronze"])
def test_not_asking_for_fast_gets_standard(two_models, name):
    d = Scheduler(two_models).decide(RouteRequest("big", tenant_of(two_models, name)), NOW, fresh(two_models, now=NOW))
    assert d.channel == "standard" and not d.downgraded and d.chosen.cluster == "big-a"


def test_l3_trial_quota_per_tenant_per_minute(two_models):
    settings = parse_routing_settings({"admission": {"L3": {"trial_per_minute": 3}}})
    cfg = make_config(
        [model("big", [dep("big-a"), dep("big-fast", channel="fast")])],
        tenants=[tenant("b1", "L3"), tenant("b2", "L3")],
    )
    s = Scheduler(cfg, settings)
    marks = fresh(cfg, now=NOW)
    b1, b2 = tenant_of(cfg, "b1"), tenant_of(cfg, "b2")
    got = [
        s.decide(RouteRequest("big", b1, want_fast=True), NOW + i, fresh(cfg, now=NOW + i)).channel
        for i in range(5)
    ]
    assert got == ["fast", "fast", "fast", "standard", "standard"]
    # Dry runs (explain) do not use the quota; another tenant has its own.
    assert s.decide(RouteRequest("big", b2, want_fast=True), NOW, marks, dry_run=True).channel == "fast"
    assert s.decide(RouteRequest("big", b2, want_fast=True), NOW, marks).channel == "fast"
    # A minute after the first fast request a slot frees up.
    later = fresh(cfg, now=NOW + 60.5)
    assert s.decide(RouteRequest("big", b1, want_fast=True), NOW + 60.5, later).channel == "fast"
    assert s.decide(RouteRequest("big", b1, want_fast=True), NOW + 60.6, later).channel == "standard"


def test_quota_not_spent_when_served_standard(two_models):
    s = Scheduler(two_models, parse_routing_settings({"admission": {"L3": {"trial_per_minute": 1}}}))
    bronze = tenant_of(two_models, "bronze")
    high = fresh(two_models, now=NOW, overrides={"big-fast": 0.5})
    assert s.decide(RouteRequest("big", bronze, want_fast=True), NOW, high).channel == "standard"
    low = fresh(two_models, now=NOW, overrides={"big-fast": 0.1})
    assert s.decide(RouteRequest("big", bronze, want_fast=True), NOW, low).channel == "fast"


def test_configured_thresholds():
    settings = parse_routing_settings({"admission": {"L1": {"max_watermark": 0.5}, "L2": {"max_watermark": 0.2}}})
    cfg = make_config(
        [model("m", [dep("m1"), dep("mf", channel="fast")])], tenants=[tenant("g", "L1"), tenant("s", "L2")]
    )
    s = Scheduler(cfg, settings)
    marks = fresh(cfg, now=NOW, overrides={"mf": 0.3})
    assert s.decide(RouteRequest("m", tenant_of(cfg, "g"), want_fast=True), NOW, marks).channel == "fast"
    assert s.decide(RouteRequest("m", tenant_of(cfg, "s"), want_fast=True), NOW, marks).channel == "standard"


def test_fast_only_model_serves_everyone():
    cfg = make_config([model("turbo", [dep("t1", channel="fast")])], tenants=[tenant("b", "L3")])
    s = Scheduler(cfg)
    b = cfg.tenants[0]
    marks = fresh(cfg, now=NOW, overrides={"t1": 0.6})
    # Not asked: it is the model's only deployment, so it serves (and says so).
    d = s.decide(RouteRequest("turbo", b), NOW, marks)
    assert d.chosen.cluster == "t1" and d.channel == "fast" and not d.downgraded
    # Asked but not admitted at 0.6: still served, and no trial slot is spent.
    d = s.decide(RouteRequest("turbo", b, want_fast=True), NOW, marks)
    assert d.chosen.cluster == "t1" and d.downgraded and not d.chosen.fast_admitted
    assert s.admission.quota_left("b", "L3", NOW)
    # Asked and admitted at 0.1: counts as fast use.
    d = s.decide(RouteRequest("turbo", b, want_fast=True), NOW, fresh(cfg, now=NOW, overrides={"t1": 0.1}))
    assert d.chosen.fast_admitted and not d.downgraded


def test_fast_only_group_member_with_standard_alternatives():
    cfg = make_config(
        [
            model("turbo", [dep("t1", channel="fast")], groups=["g"], quality=0.9),
            model("plain", [dep("p1")], groups=["g"], quality=0.5),
        ]
    )
    d = Scheduler(cfg).decide(RouteRequest("g", cfg.tenants[0], "quality"), NOW, fresh(cfg, now=NOW))
    assert d.chosen.cluster == "t1"
