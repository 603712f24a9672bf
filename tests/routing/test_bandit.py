"""The learning strategy's pure core (extproc/routing/bandit.py) and its place in the scheduler."""

import random

import pytest

from contracts.config.routing import AdaptiveSettings, RewardWeights
from extproc.routing import RouteRequest, Scheduler
from extproc.routing.bandit import Bandit, best_arm_shares, call_reward, floored

from .conftest import dep, fresh, make_config, model

KEY = ("m", "standard", "")


def test_call_reward_weighs_success_latency_and_cost():
    w = RewardWeights(success=1, latency=1, cost=0)
    assert call_reward(w, False, 0.01, 0.0, latency_target_ms=1000, cost_target=0.01) == 0.0
    # at the latency target the latency term is 0.5: (1 + 0.5) / 2
    assert call_reward(w, True, 1.0, 0.0, latency_target_ms=1000, cost_target=0.01) == pytest.approx(0.75)
    fast = call_reward(w, True, 0.01, 0.0, latency_target_ms=1000, cost_target=0.01)
    slow = call_reward(w, True, 3.0, 0.0, latency_target_ms=1000, cost_target=0.01)
    assert 1.0 > fast > 0.99 and slow == pytest.approx((1 + 0.25) / 2)
    c = RewardWeights(success=0, latency=0, cost=1)
    assert call_reward(c, True, 1.0, 0.01, latency_target_ms=1000, cost_target=0.01) == pytest.approx(0.5)


def test_floor_keeps_every_arm_above_it():
    out = floored({"a": 1.0, "b": 0.0, "c": 0.0}, 0.05)
    assert out == pytest.approx({"a": 0.9, "b": 0.05, "c": 0.05}) and sum(out.values()) == pytest.approx(1)
    assert floored({"a": 1.0, "b": 0.0}, 0.9) == pytest.approx({"a": 0.5, "b": 0.5})  # at most 1/k


def test_shares_match_the_chance_to_be_best():
    rng = random.Random(1)
    even = best_arm_shares([("a", 1, 1), ("b", 1, 1)], 4000, rng)
    assert even["a"] == pytest.approx(0.5, abs=0.03)
    # Beta(91, 11) against Beta(51, 51): a is best almost surely
    assert best_arm_shares([("a", 91, 11), ("b", 51, 51)], 1000, rng)["a"] > 0.99


def test_the_logged_propensity_is_the_chosen_arms_real_frequency():
    b = Bandit(AdaptiveSettings(models=["m"], floor=0.1, refresh_s=1e9), random.Random(2))
    for _ in range(20):
        b.learn(KEY, "a", 0.8, 0.0)
        b.learn(KEY, "b", 0.6, 0.0)
    picks = [b.choose(KEY, ["a", "b"], 0.0) for _ in range(6000)]
    shares = picks[0].shares
    assert all(p.propensity == shares[p.arm] for p in picks)
    freq_a = sum(p.arm == "a" for p in picks) / len(picks)
    assert freq_a == pytest.approx(shares["a"], abs=0.02)
    assert 0.1 <= shares["b"] < shares["a"]


def _simulate(b: Bandit, rates: dict[str, float], steps: int, t0: float, rng: random.Random,
              dt: float = 0.1) -> tuple[list[str], float]:
    chosen = []
    t = t0
    for _ in range(steps):
        pick = b.choose(KEY, sorted(rates), t)
        chosen.append(pick.arm)
        b.learn(KEY, pick.arm, 1.0 if rng.random() < rates[pick.arm] else 0.0, t)
        t += dt
    return chosen, t


def test_converges_to_the_better_arm_and_keeps_exploring():
    rng = random.Random(3)
    b = Bandit(AdaptiveSettings(models=["m"], floor=0.05, half_life_s=60), random.Random(4))
    chosen, t = _simulate(b, {"a": 0.95, "b": 0.6}, 600, 0.0, rng)
    last = chosen[-200:]
    share_a = last.count("a") / len(last)
    assert share_a >= 0.85, share_a
    assert "b" in last  # the floor keeps feeding the worse arm evidence
    assert b.shares(KEY, ["a", "b"], t)["b"] >= 0.05


def test_moves_back_when_the_arms_swap():
    rng = random.Random(5)
    b = Bandit(AdaptiveSettings(models=["m"], floor=0.05, half_life_s=20), random.Random(6))
    _, t = _simulate(b, {"a": 0.95, "b": 0.2}, 400, 0.0, rng)
    assert b.shares(KEY, ["a", "b"], t)["a"] > 0.9
    chosen, t = _simulate(b, {"a": 0.2, "b": 0.95}, 400, t, rng)
    # within 400 calls (40 s, two half-lives) traffic has moved to b
    tail = chosen[-100:]
    assert tail.count("b") / len(tail) >= 0.85


def test_three_failures_heal_by_time_alone():
    """Three failures must never steer routing for good: with no further call the lesson fades."""
    b = Bandit(AdaptiveSettings(models=["m"], floor=0.05, half_life_s=30, draws=2000), random.Random(7))
    for i in range(3):
        b.learn(KEY, "b", 0.0, float(i))
        b.learn(KEY, "a", 1.0, float(i))
    assert b.shares(KEY, ["a", "b"], 3.0)["b"] < 0.2
    later = b.shares(KEY, ["a", "b"], 3.0 + 30 * 10)  # ten half-lives on, nothing called
    assert later["b"] == pytest.approx(0.5, abs=0.05)


def test_shares_are_cached_until_refresh():
    b = Bandit(AdaptiveSettings(models=["m"], refresh_s=1.0), random.Random(8))
    first = b.shares(KEY, ["a", "b"], 0.0)
    b.learn(KEY, "a", 1.0, 0.1)
    assert b.shares(KEY, ["a", "b"], 0.5) is first  # within refresh_s: the cached shares
    assert b.shares(KEY, ["a", "b"], 1.2) is not first


@pytest.fixture
def learning():
    return make_config([model("m", [dep("m1", monitored=False), dep("m2", monitored=False)], latency_ms=300),
                        model("other", [dep("o1", monitored=False)])],
                       routing={"adaptive": {"models": ["m"], "floor": 0.1, "half_life_s": 30}})


def test_scheduler_picks_by_the_bandit_and_learns(learning):
    s = Scheduler(learning)
    s.bandit.rng = random.Random(9)
    t = learning.tenants[0]
    for i in range(300):
        d = s.decide(RouteRequest("m", t, task_id=str(i)), 100 + i * 0.05, {})
        assert d.learned is not None and d.chosen.cluster == d.learned.arm
        assert d.learned.propensity == d.learned.shares[d.learned.arm]
        assert {c.cluster for c in d.candidates} == {"m1", "m2"}  # the other arm stays as failover
        ok = d.chosen.cluster == "m2"  # m1 fails every call
        s.learn("m", "standard", "t", d.chosen.cluster, ok=ok, latency_s=0.1, cost=0.0, now=100 + i * 0.05)
    assert s.bandit.shares(("m", "standard", ""), ["m1", "m2"], 120)["m2"] >= 0.85
    # a model the bandit does not learn for is routed by score alone
    assert s.decide(RouteRequest("other", t), 120, {}).learned is None


def test_one_arm_left_is_logged_with_propensity_one(learning):
    s = Scheduler(learning)
    t = learning.tenants[0]
    for i in range(3):  # m1 cools down: only m2 may serve
        s.record("m1", 0.1, False, now=100 + i)
    d = s.decide(RouteRequest("m", t), 104, fresh(learning, now=104))
    assert d.chosen.cluster == "m2" and d.learned is not None and d.learned.propensity == 1.0


def test_per_tenant_learning_keeps_groups_apart():
    cfg = make_config([model("m", [dep("m1"), dep("m2")])],
                      routing={"adaptive": {"models": ["m"], "per_tenant": True}})
    s = Scheduler(cfg)
    assert s.bandit.group("m", "standard", "a") != s.bandit.group("m", "standard", "b")
    shared = Scheduler(make_config([model("m", [dep("m1"), dep("m2")])], routing={"adaptive": {"models": ["m"]}}))
    assert shared.bandit.group("m", "standard", "a") == shared.bandit.group("m", "standard", "b")


def test_feedback_counts_with_its_weight(learning):
    cfg = make_config([model("m", [dep("m1"), dep("m2")])],
                      routing={"adaptive": {"models": ["m"], "reward": {"success": 1, "latency": 0, "feedback": 2}}})
    s = Scheduler(cfg)
    s.learn_feedback("m", "standard", "t", "m1", 0.0, now=1.0)
    ev = s.bandit.evidence[("m", "standard", "")]["m1"]
    assert (ev.wins, ev.losses) == (0.0, 2.0)


def test_an_unknown_model_in_adaptive_is_a_warning(caplog):
    """As for guardrail policies: a model may leave the file (or a test's trimmed copy) before its entry."""
    make_config([model("m", [dep("m1")])], routing={"adaptive": {"models": ["nope"]}})
    assert "routing.adaptive.models[0]: 'nope' is not defined in this file" in caplog.text


def test_explain_shows_the_bandits_draw_and_shares(learning):
    from extproc.routing.explain import explain, format_explain

    doc = explain(Scheduler(learning), RouteRequest("m", learning.tenants[0]), 100.0, {})
    assert doc["adaptive"]["arm"] == doc["chosen"] and set(doc["adaptive"]["shares"]) == {"m1", "m2"}
    assert doc["adaptive"]["shares"]["m1"] == pytest.approx(0.5, abs=0.1)  # nothing learned: 256 draws of the prior
    assert "learning strategy (routing.adaptive) shares now: m1 0." in format_explain(doc)


def test_the_cache_holds_whatever_order_the_score_gives_the_arms():
    b = Bandit(AdaptiveSettings(models=["m"], refresh_s=1.0), random.Random(10))
    first = b.shares(KEY, ["a", "b"], 0.0)
    assert b.shares(KEY, ["b", "a"], 0.5) is first
