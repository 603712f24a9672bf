"""The demand signals an autoscaler reads (docs/deploy.md, "Scale model servers on demand") move under
a burst of OpenAI SDK callers through a real Envoy against the shipped demo-mini (max_inflight 4):
in flight against max_inflight, queue depth and wait, utilization, refusals, idleness; and every
series is there at 0 before the first call (spills included)."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
import yaml

from tests.conftest import DEMO_KEY
from tests.stack_config import ROOT, _remap, _static_envoy, free_port, start_stack

pytestmark = pytest.mark.e2e
CLUSTER = "demo-openai-mini"
BOUND = 4  # a small queue, so the burst also shows refusals


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"] = [m for m in data["models"] if m["name"] in ("demo-mini", "demo-pool")]
    mini = data["models"][0]["deployments"][0]
    mini.pop("watermark", None)
    mini.pop("warmup", None)
    mini["queue"] = {**mini["queue"], "bound": BOUND, "tenant_share": 1.0}  # one tenant may fill it
    data["tenants"] = [{**t, "allowed_models": ["*"]} for t in data["tenants"]]
    data.pop("ratelimit", None)
    data = _remap(data, {})
    data["listener"]["port"] = free_port()
    _static_envoy(data)
    with start_stack(tmp_path_factory.mktemp("demand"), data) as s:
        s.metrics = f"http://{data['extproc']['metrics_address']}/metrics"
        yield s


def _metric(stack, name: str, **labels: str) -> float | None:
    """The sum of the matching series, None when none exists."""
    text = httpx.get(stack.metrics, timeout=5).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    found = [float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
             if ln.startswith(name + "{") and all(w in ln for w in want)]
    return sum(found) if found else None


async def _until(stack, name: str, value: float, **labels: str) -> None:
    deadline = time.monotonic() + 20
    while (await asyncio.to_thread(_metric, stack, name, **labels) or 0) < value:
        assert time.monotonic() < deadline, f"{name} never reached {value}"
        await asyncio.sleep(0.02)


def test_signals_exist_at_zero_then_move_under_a_burst(stack) -> None:
    # Before any call: every series an autoscaler queries is there, at 0 (idleness counts from the start).
    assert _metric(stack, "modelyard_deployment_max_inflight", cluster=CLUSTER) == 4
    assert _metric(stack, "modelyard_deployment_utilization", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_inflight", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_queue_depth", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_queue_wait_seconds_count", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_queue_refused_total", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_spilled_total", from_cluster="pool-a", to_cluster="pool-b",
                   reason="cluster_bucket") == 0
    idle_before = _metric(stack, "modelyard_deployment_idle_seconds", cluster=CLUSTER)
    assert idle_before is not None and idle_before > 0
    assert (_metric(stack, "modelyard_deployment_idle_seconds", cluster="pool-b") or 0) > 0
    last_before = _metric(stack, "modelyard_deployment_last_request_timestamp_seconds", cluster=CLUSTER)

    async def burst() -> tuple[list, dict[str, float | None]]:
        client = openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=60,
                                    http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=50)))

        async def ask(i: int):
            try:
                return await client.chat.completions.create(
                    model="demo-mini", messages=[{"role": "user", "content": f"demo-hold-3000 burst {i}"}])
            except openai.APIStatusError as e:
                return e

        calls = [asyncio.ensure_future(ask(i)) for i in range(4 + BOUND)]
        await _until(stack, "modelyard_queue_depth", BOUND, cluster=CLUSTER)
        late = [asyncio.ensure_future(ask(i)) for i in range(100, 102)]  # past the bound: refused at once
        done = await asyncio.gather(*late)
        seen = {name: await asyncio.to_thread(_metric, stack, name, cluster=CLUSTER) for name in (
            "modelyard_inflight", "modelyard_queue_depth", "modelyard_deployment_utilization",
            "modelyard_deployment_idle_seconds", "modelyard_queue_refused_total")}
        return [*await asyncio.gather(*calls), *done], seen

    started = time.time()
    results, under_load = asyncio.run(burst())
    assert under_load == {"modelyard_inflight": 4, "modelyard_queue_depth": BOUND,
                          "modelyard_deployment_utilization": (4 + BOUND) / 4,
                          "modelyard_deployment_idle_seconds": 0, "modelyard_queue_refused_total": 2}
    refused = [r for r in results if isinstance(r, openai.APIStatusError)]
    assert [r.status_code for r in refused] == [503, 503]
    assert all(r.response.headers.get("retry-after") for r in refused)
    assert sum(1 for r in results if not isinstance(r, Exception)) == 4 + BOUND
    # After: the queue waited (its histogram counted every granted call), slots are back, idleness restarts.
    assert _metric(stack, "modelyard_queue_refused_total", cluster=CLUSTER, reason="bound") == 2
    assert _metric(stack, "modelyard_queue_wait_seconds_count", cluster=CLUSTER) == 4 + BOUND
    assert (_metric(stack, "modelyard_queue_wait_seconds_sum", cluster=CLUSTER) or 0) > 1.0  # 4 waited ~3 s
    assert _metric(stack, "modelyard_inflight", cluster=CLUSTER) == 0
    assert _metric(stack, "modelyard_deployment_utilization", cluster=CLUSTER) == 0
    last_after = _metric(stack, "modelyard_deployment_last_request_timestamp_seconds", cluster=CLUSTER) or 0
    idle_after = _metric(stack, "modelyard_deployment_idle_seconds", cluster=CLUSTER)
    assert last_after > max(last_before or 0, started + 1.0)  # stamped when the held calls ended
    assert idle_after is not None and 0 < idle_after < time.time() - started
