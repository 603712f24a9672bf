"""Routing feedback heals with time, through a real Envoy: failures that stop stop steering, and one
tenant's failures, contradicted by another tenant's successes, steer only that tenant."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
OTHER_KEY = "sk-modelyard-demo-l2"
WINDOW_S = 3.0


def _config() -> dict:
    data = small_config()
    gpt = data["models"][0]
    mini = {"name": "demo-mini", "groups": ["auto"], "task_types": ["chat"], "quality": 0.55, "latency_ms": 150,
            "cost": {"input_per_1k": 0.15, "output_per_1k": 0.6},
            "deployments": [{**gpt["deployments"][0], "cluster": "demo-openai-mini",
                             "endpoints": [f"127.0.0.1:{free_port()}"]}]}
    for dep in (gpt["deployments"][0], mini["deployments"][0]):
        dep.pop("warmup", None)
        dep.pop("health_check", None)
    data["models"].append(mini)
    data["routing"] = {"feedback": {"half_life_s": 1.0},
                       "cooldown": {"failures": 3, "window_s": WINDOW_S, "cooldown_s": 2.0}}
    return data


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    with start_stack(tmp_path_factory.mktemp("heals"), _config(), shared_demos=True) as s:
        yield s


def _ask(stack, key: str, model: str, text: str = "hello") -> httpx.Response:
    return httpx.post(f"{stack.url}/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {key}", "x-modelyard-strategy": "quality"},
                      json={"model": model, "messages": [{"role": "user", "content": text}]})


def _cluster(stack, key: str) -> str:
    r = _ask(stack, key, "auto")
    assert r.status_code == 200, r.text
    return r.headers["x-modelyard-cluster"]


def _fail_three_times(stack, key: str) -> None:
    for _ in range(3):
        assert _ask(stack, key, "demo-gpt", "demo-fail-500").status_code == 502


def _back_within(stack, key: str, bound_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < bound_s:
        if _cluster(stack, key) == "demo-openai":
            return time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"routing did not return to demo-openai within {bound_s}s")


def test_routing_returns_after_failures_stop(stack) -> None:
    assert _cluster(stack, OTHER_KEY) == "demo-openai"  # quality picks demo-gpt; this tenant is served well
    _fail_three_times(stack, DEMO_KEY)
    # Contradicted by the other tenant's success: only the failing tenant moves.
    assert _cluster(stack, OTHER_KEY) == "demo-openai"
    assert _cluster(stack, DEMO_KEY) == "demo-openai-mini"
    took = _back_within(stack, DEMO_KEY, 15)
    assert took > 0.5  # it did stay away for a while (the tenant's own cooldown)

    time.sleep(WINDOW_S + 0.5)  # the other tenant's success is out of the window: nothing contradicts
    _fail_three_times(stack, DEMO_KEY)
    assert _cluster(stack, OTHER_KEY) == "demo-openai-mini"  # as for an upstream that is down: everyone moves
    _back_within(stack, OTHER_KEY, 15)
    _back_within(stack, DEMO_KEY, 15)


# -- one failure is not evidence; a streak of them is --------------------------------------------

STREAK = 3  # routing.feedback.consecutive_failures of this stack


@pytest.fixture(scope="module")
def evidence_stack(tmp_path_factory: pytest.TempPathFactory):
    data = _config()
    # No cooldown and no healing within the test: only the error term can move the call.
    data["routing"] = {"feedback": {"half_life_s": 3600.0, "consecutive_failures": STREAK},
                       "cooldown": {"failures": 99}}
    with start_stack(tmp_path_factory.mktemp("evidence"), data, shared_demos=True) as s:
        yield s


def _cut_stream(stack) -> None:
    """A stream demo-gpt cuts (its own failure): the client sees an error event, not [DONE]."""
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {DEMO_KEY}", "x-modelyard-strategy": "quality"},
                      json={"model": "demo-gpt", "stream": True,
                            "messages": [{"role": "user", "content": "please demo-cut-stream now"}]}) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert any('"error"' in ln for ln in lines), lines[-3:]


def test_one_cut_stream_does_not_move_the_next_auto_call(evidence_stack) -> None:
    assert _cluster(evidence_stack, DEMO_KEY) == "demo-openai"
    _cut_stream(evidence_stack)
    assert _cluster(evidence_stack, DEMO_KEY) == "demo-openai"  # the failing tenant's own next call stays
    assert _cluster(evidence_stack, OTHER_KEY) == "demo-openai"


def test_consecutive_failures_at_the_threshold_move_it(evidence_stack) -> None:
    assert _cluster(evidence_stack, DEMO_KEY) == "demo-openai"  # a success: the streak starts from zero
    for _ in range(STREAK - 1):
        _cut_stream(evidence_stack)
    assert _cluster(evidence_stack, DEMO_KEY) == "demo-openai"  # one short of the threshold
    for _ in range(STREAK):
        _cut_stream(evidence_stack)
    assert _cluster(evidence_stack, DEMO_KEY) == "demo-openai-mini"
