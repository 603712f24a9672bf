"""The capability filter, name resolution and the status of a request that cannot be routed."""

import pytest

from contracts.errors import ClientError, ConfigError, NotFound, Unavailable
from contracts.watermarks import Reading
from extproc.routing import BadRouteRequest, ModelNotFound, NoCapacity, NoRoute, RouteRequest, Scheduler

from .conftest import dep, fresh, make_config, model, tenant, tenant_of

NOW = 100.0


def clusters(decision):
    return [c.cluster for c in decision.candidates]


@pytest.mark.parametrize(
    "kw, expected, reason",
    [
        ({}, {"big-a", "small-a"}, None),
        ({"est_prompt_tokens": 4000}, {"big-a", "small-a"}, None),
        ({"est_prompt_tokens": 4001}, {"big-a"}, "exceeds context window 4000"),
        ({"needs_tools": True}, {"big-a"}, "tools not supported"),
        ({"needs_vision": True}, {"big-a"}, "images not supported"),
        ({"task_type": "embedding"}, set(), "task type 'embedding' not supported"),
        ({"est_prompt_tokens": 40000}, set(), "exceeds context window 32000"),
        ({"est_output_tokens": 1024}, {"big-a", "small-a"}, None),
        ({"est_output_tokens": 1025}, {"big-a"}, "asks 1025 output tokens, over max_output_tokens 1024"),
        ({"est_output_tokens": 4097}, set(), "over max_output_tokens 4096"),
    ],
 ids=[
    "no-needs", "at-small-window", "over-small-window", "tools", "vision", "embedding-task", "over-every-window",
    "at-small-output", "over-small-output", "over-every-output",
])
def test_capability_filter_table(two_models, kw, expected, reason):
    s = Scheduler(two_models)
    req = RouteRequest("chat", tenant_of(two_models, "gold"), **kw)
    if not expected:
        with pytest.raises(NoRoute) as e:
            s.decide(req, NOW, fresh(two_models))
        assert e.value.status == 400 and reason in e.value.message
        return
    d = s.decide(req, NOW, fresh(two_models))
    assert set(clusters(d)) == expected
    if reason:
        assert any(reason in r.reason for r in d.rejected)
    # The fast deployment is never used by a request that did not ask for it.
    assert any(r.cluster == "big-fast" and r.reason == "fast channel not requested" for r in d.rejected)


def test_streaming_capability():
    cfg = make_config(
        [
            model("a", [dep("a1")], groups=["g"], capabilities={"streaming": False}),
            model("b", [dep("b1")], groups=["g"]),
        ]
    )
    d = Scheduler(cfg).decide(RouteRequest("g", cfg.tenants[0], stream=True), NOW, fresh(cfg))
    assert clusters(d) == ["b1"]


def test_concrete_model_chooses_among_its_deployments(two_models):
    d = Scheduler(two_models).decide(
        RouteRequest("big", tenant_of(two_models, "gold")), NOW, fresh(two_models, overrides={"big-a": 0.5})
    )
    assert clusters(d) == ["big-a"] and d.chosen.model == "big"


@pytest.mark.parametrize("name", ["nope", "", "CHAT", "big "])
def test_unknown_model_is_404(two_models, name):
    with pytest.raises(NoRoute) as e:
        Scheduler(two_models).decide(RouteRequest(name, tenant_of(two_models, "gold")), NOW, {})
    assert e.value.status == 404 and "not found" in e.value.message


def test_not_allowed_looks_like_not_found():
    cfg = make_config(
        [model("a", [dep("a1")], groups=["g"]), model("b", [dep("b1")], groups=["g"])],
        tenants=[tenant("only-b", allowed=["b"]), tenant("grp", allowed=["g"])],
    )
    s = Scheduler(cfg)
    with pytest.raises(NoRoute) as denied:
        s.decide(RouteRequest("a", tenant_of(cfg, "only-b")), NOW, fresh(cfg))
    with pytest.raises(NoRoute) as unknown:
        s.decide(RouteRequest("zzz", tenant_of(cfg, "only-b")), NOW, fresh(cfg))
    assert denied.value.status == unknown.value.status == 404
    assert denied.value.message.replace("'a'", "X") == unknown.value.message.replace("'zzz'", "X")
    # A group resolves to the members the tenant may use...
    assert clusters(s.decide(RouteRequest("g", tenant_of(cfg, "only-b")), NOW, fresh(cfg))) == ["b1"]
    # ...and granting the group grants all of its members.
    got = s.decide(RouteRequest("g", tenant_of(cfg, "grp")), NOW, fresh(cfg))
    assert set(clusters(got)) == {"a1", "b1"}
    with pytest.raises(NoRoute) as e:
        s.decide(RouteRequest("a", tenant_of(cfg, "grp")), NOW, fresh(cfg))
    assert e.value.status == 404


def test_auto_without_a_declared_group_means_every_model():
    cfg = make_config([model("a", [dep("a1")]), model("b", [dep("b1")])])
    d = Scheduler(cfg).decide(RouteRequest("auto", cfg.tenants[0]), NOW, fresh(cfg))
    assert set(clusters(d)) == {"a1", "b1"}


def test_unmonitored_deployment_needs_no_reading():
    cfg = make_config([model("a", [dep("a1", monitored=False)])])
    d = Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW, {})
    assert clusters(d) == ["a1"] and d.chosen.terms["load"] == 1.0


@pytest.mark.parametrize(
    "reading",
    [Reading(0.9, NOW), Reading(0.95, NOW), Reading(0.2, NOW, saturated=True)],
 ids=["watermark-0.9", "watermark-0.95", "saturated-flag"])
def test_saturation_by_a_real_reading_sheds_load_with_503_and_retry_after(reading):
    cfg = make_config([model("a", [dep("a1")])])
    with pytest.raises(NoRoute) as e:
        Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW, {"a1": reading})
    assert e.value.status == 503 and ("retry-after", "1") in e.value.headers
    assert [r.reason.split(" (")[0] for r in e.value.rejected] == ["saturated"]


@pytest.mark.parametrize("reading", [None, Reading(0.1, NOW - 3.5)], ids=["no reading", "stale"])
def test_monitoring_gone_dark_everywhere_fails_open(reading):
    cfg = make_config([model("a", [dep("a1"), dep("a2")])])
    marks = {} if reading is None else {"a1": reading, "a2": reading}
    d = Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW, marks)
    assert sorted(clusters(d)) == ["a1", "a2"] and d.fail_open == ("watermarks",)


def test_a_deployment_without_a_fresh_reading_is_avoided_while_another_has_one():
    cfg = make_config([model("a", [dep("a1"), dep("a2")])])
    d = Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW,
                              {"a1": Reading(0.1, NOW - 3.5), "a2": Reading(0.5, NOW)})
    assert clusters(d) == ["a2"] and d.fail_open == ()
    assert [r.check for r in d.rejected] == ["stale_reading"]


def test_fresh_enough_reading_is_used():
    cfg = make_config([model("a", [dep("a1")])])
    # Exactly at the staleness limit (3 intervals of 1 s) still counts.
    d = Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW, {"a1": Reading(0.89, NOW - 3.0)})
    assert clusters(d) == ["a1"]
    assert d.chosen.terms["load"] == pytest.approx(0.11)


def test_saturated_one_fails_over_to_the_other():
    cfg = make_config([model("a", [dep("a1"), dep("a2")])])
    d = Scheduler(cfg).decide(RouteRequest("a", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a1": 0.97}))
    assert clusters(d) == ["a2"]
    assert [(r.cluster, r.runtime) for r in d.rejected] == [("a1", True)]


def test_unknown_strategy_is_400_and_bad_tenant_strategy_fails_at_load(two_models):
    s = Scheduler(two_models)
    with pytest.raises(NoRoute) as e:
        s.decide(RouteRequest("chat", tenant_of(two_models, "gold"), "cheapest"), NOW, fresh(two_models))
    assert e.value.status == 400 and "cheapest" in e.value.message
    with pytest.raises(ConfigError, match=r"tenants\[0\]\.strategy"):
        make_config([model("a", [dep("a1")])], tenants=[tenant("x", strategy="fastest")])


def test_no_route_cases_sit_in_the_error_tree(two_models):
    s = Scheduler(two_models)
    gold = tenant_of(two_models, "gold")
    with pytest.raises(ModelNotFound) as missing:
        s.decide(RouteRequest("nope", gold), NOW, {})
    assert isinstance(missing.value, NotFound) and missing.value.type == "model_not_found"
    with pytest.raises(BadRouteRequest) as bad:
        s.decide(RouteRequest("chat", gold, "cheapest"), NOW, fresh(two_models))
    assert isinstance(bad.value, ClientError) and bad.value.status == 400
    busy_marks = {c: Reading(0.99, NOW) for c in fresh(two_models)}
    with pytest.raises(NoCapacity) as busy:
        s.decide(RouteRequest("chat", gold), NOW, busy_marks)
    e = busy.value
    assert isinstance(e, Unavailable) and isinstance(e, NoRoute) and e.status == 503
    # The wire type routing 503s have always had, and a retry-after of one watermark interval.
    assert e.type == "api_error" and e.retry_after_s == pytest.approx(1.0)
    assert ("retry-after", "1") in e.headers and {r.check for r in e.rejected if r.runtime} == {"saturated"}
