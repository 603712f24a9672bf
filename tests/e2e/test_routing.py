"""Scheduling through a real Envoy: strategies, GPU watermarks from fake agents, staleness,
failover when an upstream dies mid-run, and fast-channel admission for every tier."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.chaos.observe import metric
from tests.conftest import DEMO_KEY
from tests.stack_config import free_port, small_config, start_stack

pytestmark = pytest.mark.e2e
INTERVAL = 0.2
KEYS = {"L1": DEMO_KEY, "L2": "sk-modelyard-demo-l2", "L3": "sk-modelyard-demo-l3"}


def _chat(url: str, model: str, key: str = DEMO_KEY, headers: dict | None = None) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=10,
                      headers={"authorization": f"Bearer {key}", **(headers or {})},
                      json={"model": model, "messages": [{"role": "user", "content": "where do I go"}]})


@pytest.fixture(scope="module")
def unlearnt(demo_stack):
    """The shared stack with a new extproc: earlier modules' injected upstream faults (cut streams
    are the upstream's failures) may have cooled deployments down, which moves the scores."""
    demo_stack.restart("extproc")
    # Ready is its port open; the strategies pick from warm deployments only once the warm-up calls
    # made at start have answered (demo-openai-mini declares one): wait for them, not for luck.
    deadline = time.monotonic() + 15
    while any(metric(demo_stack.cfg.extproc.metrics_address, "modelyard_deployment_warming", cluster=c)
              for c in ("demo-openai", "demo-openai-mini")):
        assert time.monotonic() < deadline, "demo-openai(-mini) still warming 15 s after the restart"
        time.sleep(0.05)
    return demo_stack


@pytest.mark.parametrize("strategy,cluster", [("cost", "demo-openai-mini"), ("quality", "demo-openai")])
def test_strategy_header_picks_deployment(unlearnt, strategy: str, cluster: str) -> None:
    demo_stack = unlearnt
    r = _chat(demo_stack.url, "auto", headers={"x-modelyard-strategy": strategy})
    assert r.status_code == 200, r.text
    assert r.headers["x-modelyard-cluster"] == cluster
    assert r.headers["x-modelyard-strategy"] == strategy
    assert r.json()["choices"][0]["message"]["content"].startswith(f"[{cluster}]")


def test_declared_max_output_tokens_filters_with_real_sdks(unlearnt) -> None:
    """demo-mini declares max_output_tokens 1024: the cost strategy's first pick for `auto` is
    passed over by a call asking for more, and a model that cannot give it at all is a 400."""
    import anthropic
    import openai

    url = unlearnt.url
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEY, max_retries=0)
    ask = [{"role": "user", "content": "where do I go"}]
    within = oa.chat.completions.with_raw_response.create(
        model="auto", messages=ask, max_tokens=1024, extra_headers={"x-modelyard-strategy": "cost"})
    assert within.headers["x-modelyard-cluster"] == "demo-openai-mini"
    over = oa.chat.completions.with_raw_response.create(
        model="auto", messages=ask, max_tokens=1500, extra_headers={"x-modelyard-strategy": "cost"})
    assert over.headers["x-modelyard-cluster"] not in ("", "demo-openai-mini")
    ac = anthropic.Anthropic(base_url=url, api_key=DEMO_KEY, max_retries=0)
    msg = ac.messages.with_raw_response.create(
        model="auto", max_tokens=1500, messages=ask, extra_headers={"x-modelyard-strategy": "cost"})
    assert msg.headers["x-modelyard-cluster"] not in ("", "demo-openai-mini")
    with pytest.raises(openai.BadRequestError) as e:
        oa.chat.completions.create(model="demo-mini", messages=ask, max_tokens=1500)
    assert "over max_output_tokens 1024" in e.value.message
    with pytest.raises(anthropic.BadRequestError) as a:
        ac.messages.create(model="demo-mini", max_tokens=1500, messages=ask)
    assert "over max_output_tokens 1024" in a.value.message


def test_a_cluster_bucket_spills_to_the_peer_deployment_with_the_openai_sdk(demo_stack) -> None:
    """The shipped demo-pool: pool-a's own bucket (burst 2, 1/s) refuses, pool-b takes the call;
    the caller sees no 429, and each spilled reply names the deployment that refused it."""
    import openai

    oa = openai.OpenAI(base_url=f"{demo_stack.url}/v1", api_key=DEMO_KEY, max_retries=0)
    seen = []
    for _ in range(6):
        r = oa.chat.completions.with_raw_response.create(
            model="demo-pool", messages=[{"role": "user", "content": "spill?"}])
        assert r.http_response.status_code == 200
        seen.append((r.headers["x-modelyard-cluster"], r.headers.get("x-modelyard-spilled-from")))
    # The scheduler may also pick pool-b outright (its score learns latency); pool-a never answers spilled.
    assert set(seen) <= {("pool-a", None), ("pool-b", "pool-a"), ("pool-b", None)}, seen
    assert ("pool-b", "pool-a") in seen, seen


def test_unknown_strategy_is_400(demo_stack) -> None:
    r = _chat(demo_stack.url, "auto", headers={"x-modelyard-strategy": "vibes"})
    assert r.status_code == 400 and r.json()["error"]["message"]


TWIN_MS = 200


def _twin_config() -> dict:
    agents = {n: free_port() for n in ("a", "b", "fast")}

    def dep(name: str, channel: str = "standard") -> dict:
        return {"cluster": f"demo-twin-{name}", "protocol": "openai", "channel": channel,
                "endpoints": [f"127.0.0.1:{free_port()}"],
                "watermark": {"url": f"http://127.0.0.1:{agents[name]}/watermarks"}}

    data = small_config()
    # The twins answer in about TWIN_MS (the fixture slows both demo upstreams), as configured.
    data["models"] = [{"name": "twin", "quality": 0.7, "latency_ms": TWIN_MS,
                       "deployments": [dep("a"), dep("b"), dep("fast", "fast")]}]
    for t in data["tenants"]:
        t["allowed_models"] = ["twin"]
    # The default strategy decides: the twins' few ms of latency noise stay within its tolerance (score.scaled).
    data["routing"] = {"watermarks": {"interval_s": INTERVAL, "stale_after_intervals": 3},
                       "cooldown": {"failures": 2, "window_s": 30, "cooldown_s": 5},
                       "admission": {"L3": {"max_watermark": 0.4, "trial_per_minute": 100}}}
    return data


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory):
    with start_stack(tmp_path_factory.mktemp("twins"), _twin_config()) as stack:
        # Near-equal twins, as in production: each observed latency is TWIN_MS plus a few ms of the box's
        # noise, which under min-max scaling was the whole latency term and outweighed the watermarks.
        for d in stack.cfg.models[0].deployments[:2]:
            httpx.post(f"http://{d.endpoints[0]}/fake-queue", json={"delay_ms": TWIN_MS}, timeout=5).raise_for_status()
        yield stack


def _agent(stack, cluster: str) -> str:
    dep = next(d for d in stack.cfg.models[0].deployments if d.cluster == cluster)
    return dep.watermark.url.rsplit("/", 1)[0]


def _set_util(stack, cluster: str, util: float) -> None:
    r = httpx.post(f"{_agent(stack, cluster)}/fake", json={"util": util, "mem": 0.1})
    assert r.status_code == 200


def _read_at(stack, cluster: str) -> float:
    """When the extproc last read `cluster`'s agent (its own metric; 0 before any reading)."""
    name = "modelyard_watermark_last_reading_timestamp_seconds"
    for ln in httpx.get(f"http://{stack.cfg.extproc.metrics_address}/metrics", timeout=5).text.splitlines():
        if ln.startswith(f'{name}{{cluster="{cluster}"}}'):
            return float(ln.rsplit(" ", 1)[1])
    return 0.0


def _read_after(stack, clusters: list[str], t0: float, timeout: float = 15.0) -> None:
    """Wait until the extproc has read every one of `clusters` with a poll sent after `t0`: on a loaded
    box a fixed sleep of a few poll intervals sometimes ended before the poller had run. A reading
    stamped after `t0` may still answer a poll sent before it, so wait for the one after that (each
    cluster's poller sends its next poll only once the last one answered)."""
    deadline = time.monotonic() + timeout

    def stamped_after(c: str, t: float) -> float:
        while (seen := _read_at(stack, c)) <= t:
            assert time.monotonic() < deadline, {c: seen, "after": t}
            time.sleep(INTERVAL / 4)
        return seen

    for c in clusters:
        stamped_after(c, stamped_after(c, t0))


def _clusters(stack, n: int, **kw) -> list[str]:
    out = []
    for _ in range(n):
        r = _chat(stack.url, "twin", **kw)
        assert r.status_code == 200, r.text
        out.append(r.headers["x-modelyard-cluster"])
    return out


def test_hot_gpu_moves_traffic_within_one_poll(twins) -> None:
    t0 = time.time()
    _set_util(twins, "demo-twin-a", 0.1)
    _set_util(twins, "demo-twin-b", 0.5)
    _read_after(twins, ["demo-twin-a", "demo-twin-b"], t0)
    assert set(_clusters(twins, 5)) == {"demo-twin-a"}  # the cooler GPU wins on load
    _set_util(twins, "demo-twin-a", 0.95)
    moved_at = time.monotonic() + 10
    start = time.monotonic()
    while (now := time.monotonic()) < moved_at:
        if _clusters(twins, 1) == ["demo-twin-b"]:
            moved_at = now
    # One poll interval, plus the time a request takes on a busy 2-core box.
    assert moved_at - start <= INTERVAL + 0.3, moved_at - start
    assert set(_clusters(twins, 10)) == {"demo-twin-b"}
    _set_util(twins, "demo-twin-a", 0.1)


def test_stale_agent_is_avoided(twins) -> None:
    t0 = time.time()
    _set_util(twins, "demo-twin-a", 0.5)
    _set_util(twins, "demo-twin-b", 0.1)
    _read_after(twins, ["demo-twin-a", "demo-twin-b"], t0)
    assert set(_clusters(twins, 3)) == {"demo-twin-b"}
    agent = next(c for c in twins.children if c.name == f"agent@{_agent(twins, 'demo-twin-b').rsplit(':', 1)[1]}")
    agent.proc.terminate()
    agent.proc.wait(5)
    # b's last reading older than 3 intervals (counts as saturated) while a's stays fresh.
    time.sleep(max(0.0, _read_at(twins, "demo-twin-b") + 4 * INTERVAL + 0.2 - time.time()))
    _read_after(twins, ["demo-twin-a"], time.time())
    assert set(_clusters(twins, 5)) == {"demo-twin-a"}


@pytest.mark.parametrize("tier,util,channel", [
    ("L1", 0.85, "fast"), ("L2", 0.85, "standard"), ("L2", 0.5, "fast"),
    ("L3", 0.5, "standard"), ("L3", 0.3, "fast"),
])
def test_fast_channel_admission(twins, tier: str, util: float, channel: str) -> None:
    t0 = time.time()
    _set_util(twins, "demo-twin-fast", util)
    _set_util(twins, "demo-twin-a", 0.1)
    _read_after(twins, ["demo-twin-fast", "demo-twin-a"], t0)
    fast = _chat(twins.url, "twin", KEYS[tier], {"x-modelyard-channel": "fast"})
    assert fast.status_code == 200, fast.text
    assert fast.headers["x-modelyard-channel"] == channel
    assert (fast.headers["x-modelyard-cluster"] == "demo-twin-fast") == (channel == "fast")
    plain = _chat(twins.url, "twin", KEYS[tier])
    assert plain.headers["x-modelyard-channel"] == "standard"


def test_killing_an_upstream_mid_run_loses_nothing(tmp_path: Path) -> None:
    data = _twin_config()
    for d in data["models"][0]["deployments"]:
        d.pop("watermark")  # only failover under test here
    data["models"][0]["deployments"].pop()  # no fast deployment
    from controlplane.environments import EnvironmentConfig

    env = EnvironmentConfig(name="t", admin=None, concurrency=1,
                            access_log={"path": str(tmp_path / "access.log"), "format": "json"})
    with start_stack(tmp_path, data, env) as stack:
        results: list[int] = []
        stop = threading.Event()

        def load() -> None:
            with httpx.Client(timeout=10) as client:
                while not stop.is_set():
                    r = client.post(f"{stack.url}/v1/chat/completions", headers={"authorization": f"Bearer {DEMO_KEY}"},
                                    json={"model": "twin", "messages": [{"role": "user", "content": "keep going"}]})
                    results.append(r.status_code)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        victim = next(c for c in stack.children if c.name.startswith("demo-twin-a"))
        victim.proc.kill()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(10)
        after = [_chat(stack.url, "twin").headers["x-modelyard-cluster"] for _ in range(5)]
    assert len(results) > 20
    assert set(results) == {200}, {s: results.count(s) for s in set(results)}
    assert set(after) == {"demo-twin-b"}
