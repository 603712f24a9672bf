"""Latency in admission through a real Envoy: a fast deployment whose upstream turns slow goes over
its P99 objective (measured from the gateway's own answers) and closes to L2 and L3 fast callers,
who are served on the standard deployment, while L1 still goes fast; with no call at all it opens
again once the slow answers have left the window (time alone heals it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from extproc.routing.explain import latency_states
from tests.stack_config import free_port, small_config, start_stack

KEYS = {"L1": "sk-modelyard-demo", "L2": "sk-modelyard-demo-l2", "L3": "sk-modelyard-demo-l3"}
WINDOW_S = 6.0  # wide enough that a busy box answers the slow calls and the checks inside it


@pytest.fixture(scope="module")
def slo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    fast = f"127.0.0.1:{free_port()}"
    data = small_config()
    data["models"] = [{"name": "demo-gpt", "task_types": ["chat"], "deployments": [
        {"cluster": "demo-lat", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"]},
        {"cluster": "demo-lat-fast", "protocol": "openai", "channel": "fast", "endpoints": [fast],
         "slo": {"p99_ms": 150, "window_s": WINDOW_S, "min_samples": 5}}]}]
    with start_stack(tmp_path_factory.mktemp("slo"), data) as stack:
        yield stack, fast


def _channel(stack: Any, tier: str) -> str:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEYS[tier], max_retries=0, timeout=30)
    raw = client.chat.completions.with_raw_response.create(
        model="demo-gpt", messages=[{"role": "user", "content": "hi"}], extra_headers={"x-modelyard-channel": "fast"})
    return raw.headers["x-modelyard-channel"]


def test_over_its_p99_a_fast_deployment_closes_to_low_tiers_and_heals_by_time(slo_stack: tuple[Any, str]) -> None:
    stack, fast = slo_stack
    assert [_channel(stack, t) for t in ("L1", "L2", "L3")] == ["fast", "fast", "fast"]
    httpx.post(f"http://{fast}/fake-queue", json={"delay_ms": 300}, timeout=5).raise_for_status()
    slow_answers: list[float] = []  # when each slow answer came back
    try:
        for _ in range(5):
            assert _channel(stack, "L1") == "fast"  # L1 goes fast at any load
            slow_answers.append(time.monotonic())
        # Five answers of ~300 ms: p99 over 150 ms. L2 and L3 are served on the standard deployment.
        assert [_channel(stack, t) for t in ("L2", "L3", "L1")] == ["standard", "standard", "fast"]
        slow_answers.append(time.monotonic())
        metrics = httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text
        state = latency_states(stack.cfg, metrics)["demo-lat-fast"]  # what `route explain --live` shows
        assert state.over.startswith("p99 ") and state.p99_samples >= 5 and state.p99_s is not None
        assert state.p99_s >= 0.3
    finally:
        httpx.post(f"http://{fast}/fake-queue", json={"delay_ms": 0}, timeout=5).raise_for_status()
    # No call reaches the fast deployment now (L2 is downgraded): only the clock heals it. Once too
    # few answers are left to judge, L2 goes fast again; its quick answers are judged with the slow
    # ones still in the window, so it may close again until the last slow answer has left.
    first_fast = None
    while True:
        channel, now = _channel(stack, "L2"), time.monotonic()
        if channel == "fast" and first_fast is None:
            first_fast = now
        if channel == "fast" and now > slow_answers[-1] + WINDOW_S:
            break
        assert now < slow_answers[-1] + WINDOW_S + 10, "never admitted again"
        time.sleep(0.25)
    assert first_fast is not None and first_fast > slow_answers[0] + WINDOW_S - 0.25  # not before the window
    assert [_channel(stack, t) for t in ("L3", "L2", "L1")] == ["fast", "fast", "fast"]
