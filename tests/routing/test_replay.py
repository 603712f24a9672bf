"""Offline replay (extproc/routing/replay.py) on a synthetic log whose answer is known."""

import json
import random
import sqlite3
import subprocess
import sys

import pytest

from contracts.config.routing import AdaptiveSettings
from extproc.routing.replay import LoggedCall, candidate, logged_reward, read_logged_calls, replay
from extproc.telemetry.metering import MeteringStore, MeterRecord

# Reward = success only: an arm's value is its success rate.
SETTINGS = AdaptiveSettings(models=["m"], reward={"success": 1, "latency": 0, "cost": 0, "feedback": 0})
RATES = {"a": 0.9, "b": 0.3}


def _log(n: int, p_a: float, seed: int) -> list[LoggedCall]:
    """A logging policy that picked a with probability p_a; a succeeds 90% of the time, b 30%."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        arm = "a" if rng.random() < p_a else "b"
        ok = rng.random() < RATES[arm]
        out.append(LoggedCall(float(i), "m", "standard", "t", arm, arm, 200 if ok else 500, 10.0, 0.0,
                              p_a if arm == "a" else 1 - p_a))
    return out


@pytest.mark.parametrize("spec,truth", [("fixed:a", 0.9), ("fixed:b", 0.3), ("uniform", 0.6)])
def test_ips_and_snips_find_the_known_value_within_their_intervals(spec, truth):
    calls = _log(4000, 0.3, seed=1)  # logged mostly on the worse arm
    (g,) = replay(calls, candidate(spec, SETTINGS), SETTINGS)
    assert g.calls == 4000
    for est in (g.ips, g.snips):
        assert est.low <= truth <= est.high, (spec, est)
        assert est.high - est.low < 0.1
    # the logged policy itself earned 0.3 * 0.9 + 0.7 * 0.3 = 0.48
    assert g.logged.low <= 0.48 <= g.logged.high


def test_the_adaptive_candidate_scores_near_the_best_arm_and_says_what_it_would_change():
    calls = _log(3000, 0.5, seed=2)
    (g,) = replay(calls, candidate("adaptive", SETTINGS), SETTINGS)
    assert g.snips.value > 0.8  # close to the best arm's 0.9, far above the logged 0.6
    assert g.logged_share["a"] == pytest.approx(0.5, abs=0.03)
    assert g.candidate_share["a"] > 0.85
    assert g.effective_calls < g.calls  # weights spread: fewer effective calls than logged


def test_candidate_specs():
    tuned = candidate("adaptive:half_life_s=10,floor=0.2", SETTINGS)
    assert tuned.bandit.settings.half_life_s == 10 and tuned.bandit.settings.floor == 0.2
    with pytest.raises(ValueError, match="unknown setting"):
        candidate("adaptive:models=1", SETTINGS)
    with pytest.raises(ValueError, match="unknown strategy"):
        candidate("greedy", SETTINGS)


def test_a_failover_is_the_chosen_arms_failure():
    c = LoggedCall(0, "m", "standard", "t", "a", "b", 200, 10.0, 0.0, 0.5)
    assert logged_reward(c, SETTINGS) == 0.0
    fb = AdaptiveSettings(reward={"success": 1, "latency": 0, "feedback": 1})
    scored = LoggedCall(0, "m", "standard", "t", "a", "a", 200, 10.0, 0.0, 0.5, score=0.0)
    assert logged_reward(scored, fb) == pytest.approx(0.5)


def test_read_from_a_metering_store_and_the_cli(tmp_path):
    db = tmp_path / "metering.sqlite"
    store = MeteringStore(db)
    for i, c in enumerate(_log(400, 0.5, seed=3)):
        store.record((1000.0 + i, f"task-{i}", "t", "L1", "m", c.cluster, "standard", c.status, 10.0, None, 1, 1,
                      0.0, "adaptive", c.arm, None, 0, 0, 0, 0.0, 0, c.propensity))
    store.record(MeterRecord(5000.0, "other", "t", "L1", "m", "a", "standard", 200, 10.0, None, 1, 1, 0.0, "speed", "A"))
    store.close()
    calls = list(read_logged_calls([db]))
    assert len(calls) == 400 and {c.propensity for c in calls} == {0.5}
    assert len(list(read_logged_calls([db], since=1200.0))) == 200
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM requests WHERE propensity IS NULL").fetchone()[0] == 1
    cfg = tmp_path / "modelyard.yaml"
    cfg.write_text(json.dumps({
        "models": [{"name": "m", "deployments": [{"cluster": c, "protocol": "openai", "endpoints": ["127.0.0.1:9"]}
                                                 for c in ("a", "b")]}],
        "tenants": [{"name": "t", "api_keys": ["sha256:" + "0" * 64]}],
        "routing": {"adaptive": {"models": ["m"], "reward": {"success": 1, "latency": 0}}}}))
    out = subprocess.run([sys.executable, "-m", "modelyard.cli", "route", "replay", "-c", str(cfg), "--json",
                          "--strategy", "fixed:a", "--strategy", "uniform", "--metering-db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    fixed_a, uniform = json.loads(out.stdout)
    on_a = [c.status == 200 for c in calls if c.arm == "a"]
    # fixed:a weighs only a's calls, all alike: SNIPS is exactly their success rate
    assert fixed_a["strategy"] == "fixed:a" and fixed_a["snips"]["value"] == pytest.approx(sum(on_a) / len(on_a))
    assert uniform["strategy"] == "uniform" and uniform["calls"] == 400
    bad = subprocess.run([sys.executable, "-m", "modelyard.cli", "route", "replay", "-c", str(cfg),
                          "--strategy", "vibes", "--metering-db", str(db)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown strategy 'vibes'" in bad.stderr


def test_a_call_with_one_arm_left_is_routed_alike_by_every_candidate():
    """Propensity 1: the other arms were filtered (cooling down); the candidate had no choice either."""
    calls = [LoggedCall(float(i), "m", "standard", "t", "b", "b", 200, 10.0, 0.0, 1.0) for i in range(10)]
    calls.append(LoggedCall(10.0, "m", "standard", "t", "a", "a", 200, 10.0, 0.0, 0.5))
    (g,) = replay(calls, candidate("uniform", SETTINGS), SETTINGS)
    assert g.ips.value == pytest.approx((10 * 1.0 + 1.0) / 11)  # weights 1 for the forced calls, 0.5/0.5 for a
    assert g.candidate_share["b"] == pytest.approx((10 + 0.5) / 11)
