"""A deployment's LB policy and health checks, through a real Envoy in front of several demo
endpoints: weighted round robin splits by weight, ring hash keeps a session on one endpoint,
and an endpoint that fails its active health check gets no traffic until it passes again."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.stack_config import free_port, small_config, start_stack

KEY = "sk-modelyard-demo"


def _model(name: str, cluster: str, ports: list[int], **deployment: Any) -> dict[str, Any]:
    return {"name": name, "task_types": ["chat"], "deployments": [{
        "cluster": cluster, "protocol": "openai", "endpoints": [f"127.0.0.1:{p}" for p in ports], **deployment}]}


@pytest.fixture(scope="module")
def lb_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, list[int]]]]:
    ports = {"weighted": [free_port(), free_port()], "affinity": [free_port() for _ in range(3)],
             "health": [free_port(), free_port()]}
    data = small_config()
    data["models"] = [
        _model("lb-weighted", "demo-lbw", ports["weighted"],
               lb={"weights": {f"127.0.0.1:{ports['weighted'][1]}": 3}}),
        _model("lb-affinity", "demo-lba", ports["affinity"],
               lb={"policy": "ring_hash", "hash_header": "x-session-id"}),
        _model("lb-health", "demo-lbh", ports["health"],
               health_check={"http_path": "/health", "interval_s": 0.3, "timeout_s": 0.5,
                             "unhealthy_threshold": 1, "healthy_threshold": 1}),
    ]
    with start_stack(tmp_path_factory.mktemp("lb"), data) as stack:
        yield stack, ports


def _ask(client: httpx.Client, stack: Any, model: str, headers: dict[str, str] | None = None) -> None:
    r = client.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {KEY}", **(headers or {})},
                    json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


def _served(ports: list[int]) -> list[int]:
    return [httpx.get(f"http://127.0.0.1:{p}/stats", timeout=5).json()["requests"] for p in ports]


def _delta(before: list[int], ports: list[int]) -> list[int]:
    return [a - b for a, b in zip(_served(ports), before, strict=True)]


def _host_health(stack: Any, cluster: str) -> dict[str, str]:
    """endpoint -> Envoy's health flags for it, from the admin /clusters listing."""
    out = {}
    for line in httpx.get(f"{stack.admin_url()}/clusters", timeout=5).text.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] == cluster and parts[2] == "health_flags":
            out[parts[1]] = parts[3]
    return out


def _wait_health(stack: Any, cluster: str, endpoint: str, want_healthy: bool, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        flags = _host_health(stack, cluster).get(endpoint, "")
        if (flags == "healthy") == want_healthy:
            return
        time.sleep(0.1)
    raise AssertionError(f"{endpoint} of {cluster}: health flags {_host_health(stack, cluster)}")


def test_weighted_round_robin_splits_by_weight(lb_stack: tuple[Any, dict[str, list[int]]]) -> None:
    stack, ports = lb_stack
    before = _served(ports["weighted"])
    with httpx.Client(timeout=30) as client:
        for _ in range(200):
            _ask(client, stack, "lb-weighted")
    light, heavy = _delta(before, ports["weighted"])
    assert light + heavy == 200
    assert 2.4 <= heavy / light <= 3.6, (light, heavy)


def test_ring_hash_keeps_a_session_on_one_endpoint(lb_stack: tuple[Any, dict[str, list[int]]]) -> None:
    stack, ports = lb_stack
    with httpx.Client(timeout=30) as client:
        used_by_session = []
        for session in range(8):
            before = _served(ports["affinity"])
            for _ in range(6):
                _ask(client, stack, "lb-affinity", {"x-session-id": f"user-{session}"})
            delta = _delta(before, ports["affinity"])
            assert sorted(delta) == [0, 0, 6], (session, delta)  # every request of the session on one endpoint
            used_by_session.append(delta.index(6))
    assert len(set(used_by_session)) > 1  # and different sessions spread over the endpoints


def test_an_endpoint_failing_its_health_check_gets_no_traffic(lb_stack: tuple[Any, dict[str, list[int]]]) -> None:
    stack, ports = lb_stack
    up, down = (f"127.0.0.1:{p}" for p in ports["health"])
    _wait_health(stack, "demo-lbh", down, want_healthy=True)
    victim = stack.child(f"demo-lbh@{ports['health'][1]}")
    victim.proc.send_signal(signal.SIGSTOP)  # hangs: connections open, health checks time out
    try:
        _wait_health(stack, "demo-lbh", down, want_healthy=False)
        assert _host_health(stack, "demo-lbh")[up] == "healthy"
        before = _served(ports["health"][:1])
        started = time.monotonic()
        with httpx.Client(timeout=30) as client:
            for _ in range(30):
                _ask(client, stack, "lb-health")
        assert _delta(before, ports["health"][:1]) == [30]  # all on the healthy one
        assert time.monotonic() - started < 15  # none waited on the hung endpoint's timeout
    finally:
        victim.proc.send_signal(signal.SIGCONT)
    _wait_health(stack, "demo-lbh", down, want_healthy=True)
    # Back in rotation once it passes again (Envoy's workers see the change a moment after admin does).
    before = _served(ports["health"])
    deadline = time.monotonic() + 15
    with httpx.Client(timeout=30) as client:
        while _delta(before, ports["health"])[1] == 0 and time.monotonic() < deadline:
            _ask(client, stack, "lb-health")
    assert _delta(before, ports["health"])[1] > 0


def test_demo_config_checks_every_deployment(tmp_path: Path) -> None:
    """`make up`'s config: every demo deployment is health-checked, REST by HTTP, KServe by gRPC,
    and Envoy reports every endpoint healthy (the gRPC demo answers the standard health service)."""
    from tests.stack_config import demo_config_free_ports, without_watermarks

    data, _ = demo_config_free_ports()
    data = without_watermarks(data)
    with start_stack(tmp_path, data, shared_demos=True) as stack:
        # A scale-from-zero deployment has no replica until a call wakes it: its check fails until then.
        cold = {d["cluster"] for m in data["models"] for d in m["deployments"] if d.get("scale_from_zero")}
        deadline = time.monotonic() + 20
        while True:
            flags = {c: _host_health(stack, c) for m in data["models"] for c in (d["cluster"] for d in m["deployments"])}
            up = {c: f for c, f in flags.items() if c not in cold}
            if all(f and set(f.values()) == {"healthy"} for f in up.values()) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert all(f and set(f.values()) == {"healthy"} for f in up.values()), \
            {c: f for c, f in up.items() if not f or set(f.values()) != {"healthy"}}
        assert cold and all("healthy" not in f.values() for c, f in flags.items() if c in cold), flags
