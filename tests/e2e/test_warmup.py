"""Warm-up through a real Envoy: a deployment whose warm-up has not answered gets no traffic while
a warm peer exists, a model whose only deployment is warming is still served (fail open), and
SIGHUP warms again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.chaos.observe import metric
from tests.stack_config import free_port, small_config, start_stack

KEY = "sk-modelyard-demo"
STUCK = {"prompt": "demo-fail-500", "timeout_s": 600, "retry_interval_s": 0.2}  # answers 500 until the test ends


def _dep(cluster: str, warmup: dict[str, Any]) -> dict[str, Any]:
    return {"cluster": cluster, "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"], "warmup": warmup}


@pytest.fixture(scope="module")
def warm_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    data = small_config()
    data["models"] = [
        {"name": "warm-model", "deployments": [_dep("demo-wa", STUCK), _dep("demo-wb", {"prompt": "ping"})]},
        {"name": "warm-only", "deployments": [_dep("demo-wc", STUCK)]},
    ]
    with start_stack(tmp_path_factory.mktemp("warm"), data, shared_demos=True) as stack:
        yield stack, data["extproc"]["metrics_address"]


def _ask(stack: Any, model: str) -> httpx.Response:
    r = httpx.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"},
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 200, r.text
    return r


def _wait_metric(metrics: str, name: str, want: float, timeout: float = 15, **labels: str) -> None:
    deadline = time.monotonic() + timeout
    while metric(metrics, name, **labels) != want:
        assert time.monotonic() < deadline, (name, labels, metric(metrics, name, **labels))
        time.sleep(0.1)


def test_traffic_waits_for_the_warmup(warm_stack: tuple[Any, str]) -> None:
    stack, metrics = warm_stack
    _wait_metric(metrics, "modelyard_warmups_total", 1, cluster="demo-wb", outcome="ok")
    assert metric(metrics, "modelyard_deployment_warming", cluster="demo-wa") == 1
    answered = {_ask(stack, "warm-model").headers["x-modelyard-cluster"] for _ in range(10)}
    assert answered == {"demo-wb"}


def test_a_model_with_only_warming_deployments_is_still_served(warm_stack: tuple[Any, str]) -> None:
    stack, metrics = warm_stack
    assert metric(metrics, "modelyard_deployment_warming", cluster="demo-wc") == 1
    assert _ask(stack, "warm-only").headers["x-modelyard-cluster"] == "demo-wc"
    assert metric(metrics, "modelyard_routing_fail_open_total", check="warming") >= 1


def test_sighup_warms_again(warm_stack: tuple[Any, str]) -> None:
    stack, metrics = warm_stack
    _wait_metric(metrics, "modelyard_warmups_total", 1, cluster="demo-wb", outcome="ok")
    stack.child("extproc").proc.send_signal(signal.SIGHUP)
    _wait_metric(metrics, "modelyard_warmups_total", 2, cluster="demo-wb", outcome="ok")
    assert metric(metrics, "modelyard_deployment_warming", cluster="demo-wa") == 1  # still stuck, not restarted twice
