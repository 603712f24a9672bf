"""Scale from zero through a real Envoy and the OpenAI SDK: a deployment with no replica holds its
callers in its queue, asks a stand-in Kubernetes API for one (the scale subresource, with the
service-account token), and serves them in arrival order once the replica passes its health check
and answered its warm-up; past the tier's wait, a 503 with retry-after in OpenAI's shape."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from devstack.demo.scaler import Scaler
from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack
from tests.threaded_app import ThreadedApp

pytestmark = pytest.mark.e2e
L3 = "sk-modelyard-demo-l3"
TOKEN = "stand-in-service-account-token"


def _cold_model(name: str, cluster: str, upstream: int, api: int, token_file: str) -> dict:
    return {"name": name, "task_types": ["chat"], "capabilities": {"context_window": 8192, "max_output_tokens": 1024},
            "deployments": [{
                "cluster": cluster, "protocol": "openai", "endpoints": [f"127.0.0.1:{upstream}"],
                "health_check": {"http_path": "/health", "interval_s": 1},
                "warmup": {"prompt": "ping"},
                "max_inflight": 1,
                "queue": {"bound": 16, "max_wait_s": {"L1": 30, "L3": 1.5}, "tenant_share": 1.0},
                "scale_from_zero": {"probe_s": 0.1, "kubernetes": {
                    "namespace": "models", "deployment": cluster, "api_url": f"http://127.0.0.1:{api}",
                    "token_file": token_file, "ca_file": None}}}]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("scale-from-zero")
    token = work / "token"
    token.write_text(TOKEN + "\n")
    up_fast, up_slow = free_port(), free_port()
    fast = Scaler(up_fast, name="cold", start_delay_s=None)  # the test starts it once every caller waits
    slow = Scaler(up_slow, name="cold-slow", start_delay_s=600)  # never up within the test
    with ThreadedApp(fast.app()) as fast_api, ThreadedApp(slow.app()) as slow_api:
        fast.api = fast_api
        data = small_config()
        data["models"] += [_cold_model("cold", "cold-mini", up_fast, fast_api.port, str(token)),
                           _cold_model("cold-slow", "cold-slow", up_slow, slow_api.port, str(token))]
        data["tenants"] = [{**t, "allowed_models": ["*"]} for t in data["tenants"]]
        with start_stack(work, data) as s:
            s.fast, s.slow = fast, slow
            s.metrics = f"http://{data['extproc']['metrics_address']}/metrics"
            yield s


def _metric(stack, name: str, **labels: str) -> float:
    text = httpx.get(stack.metrics, timeout=5).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") and all(w in ln for w in want))


def _client(stack, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=60)


def test_held_callers_all_served_in_arrival_order_once_a_replica_is_up(stack) -> None:
    assert _metric(stack, "modelyard_scale_ready", cluster="cold-mini") == 0
    assert stack.fast.calls == []  # nobody asked for a replica before a caller came

    async def run() -> list:
        client = _client(stack, DEMO_KEY)
        calls = []
        for i in range(5):
            calls.append(asyncio.ensure_future(client.chat.completions.create(
                model="cold", messages=[{"role": "user", "content": f"held {i}"}])))
            deadline = time.monotonic() + 10
            while await asyncio.to_thread(_metric, stack, "modelyard_queue_depth", cluster="cold-mini") < i + 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
        # All five are held, and the replica was asked for once, while none is up.
        assert [c["method"] for c in stack.fast.calls] == ["PATCH"] and stack.fast.started_at is None
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(stack.fast.start_now(), stack.fast.api.loop))
        return await asyncio.gather(*calls)

    answers = asyncio.run(run())
    texts = [a.choices[0].message.content for a in answers]
    assert all(t.endswith(f"echo: held {i}") for i, t in enumerate(texts)), texts
    arrivals = [int(a.id.rsplit("-", 1)[1]) for a in answers]
    assert arrivals == sorted(arrivals) and arrivals[0] >= 2  # in order; the warm-up went first
    assert len(stack.fast.calls) == 1  # one scale request for the whole held queue
    call = stack.fast.calls[0]
    assert call["method"] == "PATCH" and call["path"] == "/apis/apps/v1/namespaces/models/deployments/cold-mini/scale"
    assert call["replicas"] == 1 and call["authorization"] == f"Bearer {TOKEN}"
    assert call["content_type"] == "application/merge-patch+json"
    assert _metric(stack, "modelyard_scale_ready", cluster="cold-mini") == 1
    assert _metric(stack, "modelyard_scale_requests_total", cluster="cold-mini", outcome="ok") == 1
    assert _metric(stack, "modelyard_scale_from_zero_seconds_count", cluster="cold-mini") == 1


def test_past_the_wait_a_held_caller_gets_503_with_retry_after(stack) -> None:
    async def run() -> openai.APIStatusError:
        with pytest.raises(openai.APIStatusError) as err:
            await _client(stack, L3).chat.completions.create(
                model="cold-slow", messages=[{"role": "user", "content": "nobody comes"}])
        return err.value

    started = time.monotonic()
    e = asyncio.run(run())
    assert e.status_code == 503 and int(e.response.headers["retry-after"]) >= 1
    assert e.response.json()["error"]["type"]  # OpenAI's error shape
    assert 1.4 < time.monotonic() - started < 10
    assert [c["method"] for c in stack.slow.calls] == ["PATCH"]
    assert _metric(stack, "modelyard_queue_refused_total", cluster="cold-slow", reason="max_wait") == 1
