"""Score terms, strategies, A/B weight sets."""

from pathlib import Path

import pytest

from contracts.config import load_config
from extproc.routing import RouteRequest, Scheduler, parse_routing_settings

from .conftest import dep, fresh, make_config, model, tenant, tenant_of

NOW = 100.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "strategy, cluster",
    [("cost", "demo-openai-mini"), ("quality", "demo-openai"), ("speed", "demo-openai-mini")],
)
def test_demo_config_strategies(strategy, cluster):
    cfg = load_config(ROOT / "modelyard.yaml")
    s = Scheduler(cfg)
    demo = tenant_of(cfg, "demo")
    d = s.decide(RouteRequest("auto", demo, strategy_override=strategy), NOW, fresh(cfg))
    assert d.chosen.cluster == cluster
    assert d.strategy == strategy and d.channel == "standard"
    # The other model is next in line for failover.
    assert [c.cluster for c in d.candidates] == (
        ["demo-openai-mini", "demo-openai"] if cluster == "demo-openai-mini" else ["demo-openai", "demo-openai-mini"]
    )


@pytest.mark.parametrize(
    "strategy, expected",
    [("cost", "small-a"), ("speed", "small-a"), ("quality", "big-a"), ("balanced", "small-a")],
)
def test_strategy_table(two_models, strategy, expected):
    d = Scheduler(two_models).decide(
        RouteRequest("chat", tenant_of(two_models, "gold"), strategy), NOW, fresh(two_models)
    )
    assert d.chosen.cluster == expected


def test_tenant_strategy_and_header_override():
    cfg = make_config(
        [
            model("strong", [dep("s1")], groups=["g"], quality=0.95, cost={"input_per_1k": 5}),
            model("cheap", [dep("c1")], groups=["g"], quality=0.4, cost={"input_per_1k": 0.1}),
        ],
        tenants=[tenant("q", strategy="quality"), tenant("c", strategy="cost")],
    )
    s = Scheduler(cfg)
    marks = fresh(cfg)
    assert s.decide(RouteRequest("g", tenant_of(cfg, "q"), est_prompt_tokens=1000), NOW, marks).chosen.cluster == "s1"
    assert s.decide(RouteRequest("g", tenant_of(cfg, "c"), est_prompt_tokens=1000), NOW, marks).chosen.cluster == "c1"
    over = s.decide(RouteRequest("g", tenant_of(cfg, "q"), "cost", est_prompt_tokens=1000), NOW, marks)
    assert over.chosen.cluster == "c1" and over.strategy == "cost"


def test_terms_are_normalised(two_models):
    d = Scheduler(two_models).decide(
        RouteRequest("chat", tenant_of(two_models, "gold"), est_prompt_tokens=500),
        NOW,
        fresh(two_models, overrides={"big-a": 0.6, "small-a": 0.2}),
    )
    by = {c.cluster: c.terms for c in d.candidates}
    assert by["small-a"]["latency"] == 1.0 and by["big-a"]["latency"] == 0.0
    assert by["small-a"]["cost"] == 1.0 and by["big-a"]["cost"] == 0.0
    assert by["big-a"]["load"] == pytest.approx(0.4) and by["small-a"]["load"] == pytest.approx(0.8)
    assert by["big-a"]["quality"] == 0.9
    for c in d.candidates:
        assert 0.0 <= c.score <= 1.0
        assert all(0.0 <= c.terms[k] <= 1.0 for k in ("quality", "latency", "cost", "load"))
    scores = [c.score for c in d.candidates]
    assert scores == sorted(scores, reverse=True)


def test_load_moves_traffic_between_deployments():
    cfg = make_config([model("m", [dep("m1"), dep("m2")])])
    s = Scheduler(cfg)
    t = cfg.tenants[0]
    assert s.decide(RouteRequest("m", t), NOW, fresh(cfg, overrides={"m1": 0.8, "m2": 0.1})).chosen.cluster == "m2"
    assert s.decide(RouteRequest("m", t), NOW, fresh(cfg, overrides={"m1": 0.1, "m2": 0.8})).chosen.cluster == "m1"
    # Equal everything: config order decides, so the choice is reproducible.
    assert s.decide(RouteRequest("m", t), NOW, fresh(cfg)).chosen.cluster == "m1"


def test_custom_strategy_from_config():
    cfg = make_config(
        [
            model("slow-good", [dep("a")], groups=["g"], quality=0.9, latency_ms=2000),
            model("fast-bad", [dep("b")], groups=["g"], quality=0.3, latency_ms=50),
        ],
        tenants=[tenant("t", strategy="latency-only")],
        routing={"strategies": {"latency-only": {"latency": 1}}},
    )
    assert Scheduler(cfg).decide(RouteRequest("g", cfg.tenants[0]), NOW, fresh(cfg)).chosen.cluster == "b"


def test_ab_split_holds_and_is_deterministic(two_models):
    settings = parse_routing_settings(
        {"ab": {"share_b": 0.1, "weights_b": {"balanced": {"quality": 1.0}}}}
    )
    s = Scheduler(two_models, settings)
    gold = tenant_of(two_models, "gold")
    marks = fresh(two_models)
    arms = {"A": 0, "B": 0}
    for i in range(10_000):
        d = s.decide(RouteRequest("chat", gold, task_id=f"task-{i}"), NOW, marks)
        arms[d.arm] += 1
        # Weight set B is pure quality, so B picks the strong model and A the balanced one.
        assert d.chosen.cluster == ("big-a" if d.arm == "B" else "small-a")
    assert abs(arms["B"] / 10_000 - 0.1) < 0.01
    # The same task id always lands in the same arm.
    assert {s.arm_for("task-42") for _ in range(5)} == {s.arm_for("task-42")}
    again = Scheduler(two_models, settings)
    assert [again.arm_for(f"task-{i}") for i in range(200)] == [s.arm_for(f"task-{i}") for i in range(200)]


def test_ab_only_for_strategies_with_a_b_set(two_models):
    settings = parse_routing_settings({"ab": {"share_b": 1.0, "weights_b": {"quality": {"cost": 1}}}})
    s = Scheduler(two_models, settings)
    gold = tenant_of(two_models, "gold")
    assert s.decide(RouteRequest("chat", gold, "balanced"), NOW, fresh(two_models)).arm == "A"
    d = s.decide(RouteRequest("chat", gold, "quality"), NOW, fresh(two_models))
    assert d.arm == "B" and d.chosen.cluster == "small-a"


def test_no_ab_by_default(two_models):
    s = Scheduler(two_models)
    assert {s.arm_for(str(i)) for i in range(1000)} == {"A"}


# -- tolerance: differences within noise do not decide (score.scaled) --------------------------------


def _twins(**routing):
    cfg = make_config([model("twin", [dep("a"), dep("b")], latency_ms=100)], routing=routing or None)
    return cfg, Scheduler(cfg)


def _observe(s, cluster: str, latency_s: float, n: int = 30) -> None:
    for _ in range(n):
        s.record(cluster, latency_s, True, now=NOW)


def test_near_equal_latencies_let_load_decide():
    """Twins observed at 101 and 104 ms: the 3 ms are a small term, so the cooler twin wins (under
    min-max they were the whole latency term, 0.25 against load's 0.15 x 0.4, and the hotter won)."""
    cfg, s = _twins()
    _observe(s, "a", 0.101)
    _observe(s, "b", 0.104)
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.5, "b": 0.1}))
    assert d.chosen.cluster == "b"
    by = {c.cluster: c.terms for c in d.candidates}
    assert by["a"]["latency"] == 1.0 and 0.9 < by["b"]["latency"] < 1.0
    # The other way round too: load, not config order, decides.
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.1, "b": 0.5}))
    assert d.chosen.cluster == "a"


def test_tolerance_zero_is_min_max_per_strategy():
    """The tolerance is the strategy's: 0 scales min-max, and then the same 3 ms outweigh the load."""
    cfg, s = _twins(strategies={"balanced": {"quality": 0.35, "latency": 0.25, "cost": 0.25, "load": 0.15,
                                             "latency_tolerance": 0, "latency_tolerance_ms": 0}})
    _observe(s, "a", 0.101)
    _observe(s, "b", 0.104)
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.5, "b": 0.1}))
    assert d.chosen.cluster == "a"
    assert {c.cluster: c.terms["latency"] for c in d.candidates} == {"a": 1.0, "b": 0.0}


def test_clearly_different_latencies_still_dominate():
    """100 ms against 300 ms: the full term, as under min-max, so the faster twin wins though hotter."""
    cfg, s = _twins()
    _observe(s, "a", 0.1, n=50)
    _observe(s, "b", 0.3, n=50)
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.5, "b": 0.1}))
    assert d.chosen.cluster == "a"
    assert {c.cluster: c.terms["latency"] for c in d.candidates} == {"a": 1.0, "b": 0.0}


def test_single_candidate_scores_full_terms():
    cfg = make_config([model("solo", [dep("only")], latency_ms=100, cost={"input_per_1k": 1.0})])
    s = Scheduler(cfg)
    _observe(s, "only", 0.25)
    d = s.decide(RouteRequest("solo", cfg.tenants[0], est_prompt_tokens=100), NOW, fresh(cfg, overrides={"only": 0.2}))
    (c,) = d.candidates
    assert c.terms["latency"] == 1.0 and c.terms["cost"] == 1.0
    assert c.score == pytest.approx(0.35 * 0.5 + 0.25 + 0.25 + 0.15 * 0.8)  # the default quality, 0.5


def test_missing_latency_readings_use_the_prior():
    """A twin with no readings scores its configured latency: near an observed one, load decides; far
    from it, latency does."""
    cfg, s = _twins()
    _observe(s, "a", 0.102)  # b has none: 100 ms, the prior
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.1, "b": 0.5}))
    assert d.chosen.cluster == "a"
    assert d.candidates[1].terms["latency_s"] == pytest.approx(0.1)
    cfg, s = _twins()
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.5, "b": 0.1}))
    assert d.chosen.cluster == "b"  # neither has readings: equal terms, load decides
    assert [c.terms["latency"] for c in d.candidates] == [1.0, 1.0]
    _observe(s, "a", 1.0, n=50)  # now a is measured slow against b's 100 ms prior
    d = s.decide(RouteRequest("twin", cfg.tenants[0]), NOW, fresh(cfg, overrides={"a": 0.1, "b": 0.5}))
    assert d.chosen.cluster == "b"


def test_near_equal_costs_do_not_decide():
    """1% apart in price is a small cost term; 3x apart is the full one."""
    cfg = make_config([model("m", [dep("a", cost={"input_per_1k": 1.00}), dep("b", cost={"input_per_1k": 1.01})],
                             latency_ms=100)])
    d = Scheduler(cfg).decide(RouteRequest("m", cfg.tenants[0], est_prompt_tokens=1000), NOW,
                              fresh(cfg, overrides={"a": 0.5, "b": 0.1}))
    assert d.chosen.cluster == "b"
    assert {c.cluster: round(c.terms["cost"], 3) for c in d.candidates} == {"a": 1.0, "b": 0.98}


def test_scaled_edges():
    from extproc.routing.score import scaled

    assert scaled([0.1, 0.3], 0.5, 0.01) == ([1.0, 0.0], pytest.approx(0.2))
    terms, spread = scaled([0.100, 0.103], 0.5, 0.01)
    assert spread == pytest.approx(0.05) and terms == [1.0, pytest.approx(0.94)]
    assert scaled([0.002, 0.005], 0.5, 0.01)[0] == [1.0, pytest.approx(0.7)]  # the ms floor on tiny latencies
    assert scaled([0.0, 0.0], 0.5, 0.0) == ([1.0, 1.0], 0.0)  # free and equal: full terms, no division
    assert scaled([0.0, 0.02], 0.5, 0.0)[0] == [1.0, 0.0]  # free against priced: the full term
    assert scaled([0.7], 0.0, 0.0) == ([1.0], 0.0)
