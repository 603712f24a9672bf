"""Per-deployment queues through a real Envoy and the OpenAI SDK: tier priority, fair shares across
tenants, refusals in the caller's shape, and no request lost or duplicated when slots end badly."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest
import yaml

from tests.conftest import DEMO_KEY
from tests.stack_config import ROOT, small_config, start_stack
from tests.stack_config import until as _until

pytestmark = pytest.mark.e2e
CLUSTER = "demo-openai"
L1, L2, L3, L3_OTHER = DEMO_KEY, "sk-modelyard-demo-l2", "sk-modelyard-demo-l3", "sk-modelyard-demo-limited"


def _queued_config(max_inflight: int, **queue: object) -> dict:
    data = small_config()
    data["models"][0]["deployments"][0].update(max_inflight=max_inflight, queue=queue)
    return data


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory):
    data = _queued_config(1, bound=64, max_wait_s=45, tenant_share=0.5)
    with start_stack(tmp_path_factory.mktemp("one-slot"), data) as stack:
        stack.metrics = f"http://{data['extproc']['metrics_address']}/metrics"
        yield stack


def _metric(stack, name: str, **labels: str) -> float:
    text = httpx.get(stack.metrics, timeout=5).text
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith(name + "{") and all(w in ln for w in want))


def _idle(stack) -> None:
    _until(lambda: _metric(stack, "modelyard_inflight", cluster=CLUSTER) == 0
           and _metric(stack, "modelyard_queue_depth", cluster=CLUSTER) == 0)


def _client(stack, key: str, timeout: float = 90.0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=timeout,
                              http_client=httpx.AsyncClient(limits=httpx.Limits(max_connections=200), timeout=timeout))


async def _ask(client: openai.AsyncOpenAI, text: str) -> tuple[str, float, str]:
    """(answer text, queue wait in seconds, the upstream's response id: its arrival counter)."""
    raw = await client.chat.completions.with_raw_response.create(
        model="demo-gpt", messages=[{"role": "user", "content": text}])
    resp = raw.parse()
    return resp.choices[0].message.content or "", float(raw.headers["x-modelyard-queue-wait-ms"]) / 1000, resp.id


def _arrival(response_id: str) -> int:
    return int(response_id.rsplit("-", 1)[1])


async def _wait_metric(stack, name: str, value: float, **labels: str) -> None:
    await asyncio.to_thread(_until, lambda: _metric(stack, name, **labels) >= value)


def test_l1_queued_behind_l3_goes_first(one_slot) -> None:
    _idle(one_slot)

    async def run() -> tuple[list, tuple]:
        l1, l2, l3 = _client(one_slot, L1), _client(one_slot, L2), _client(one_slot, L3)
        holder = asyncio.ensure_future(_ask(l3, "demo-hold-3000 holder"))
        await _wait_metric(one_slot, "modelyard_inflight", 1, cluster=CLUSTER)
        low = []
        for i in range(3):
            low.append(asyncio.ensure_future(_ask(l3, f"l3 number {i}")))
            await _wait_metric(one_slot, "modelyard_queue_depth", i + 1, cluster=CLUSTER, tier="L3")
        mid = asyncio.ensure_future(_ask(l2, "l2 request"))
        await _wait_metric(one_slot, "modelyard_queue_depth", 1, cluster=CLUSTER, tier="L2")
        high = asyncio.ensure_future(_ask(l1, "l1 request"))
        await _wait_metric(one_slot, "modelyard_queue_depth", 1, cluster=CLUSTER, tier="L1")
        await holder
        return await asyncio.gather(*low), (await mid, await high)

    low, (mid, high) = asyncio.run(run())
    assert high[0].endswith("echo: l1 request") and mid[0].endswith("echo: l2 request")
    order = sorted([(_arrival(r[2]), r[0].rsplit(": ", 1)[1]) for r in [*low, mid, high]])
    assert [text for _, text in order] == ["l1 request", "l2 request", "l3 number 0", "l3 number 1", "l3 number 2"]
    assert high[1] > 0.2  # it did wait for the holder's slot
    wait_count = _metric(one_slot, "modelyard_queue_wait_seconds_count", cluster=CLUSTER, tier="L1")
    assert wait_count >= 1


def test_route_explain_live_shows_the_queue(one_slot, capsys) -> None:
    from extproc.routing.explain import explain_main

    _idle(one_slot)

    async def run() -> dict:
        client = _client(one_slot, L3)
        calls = [asyncio.ensure_future(_ask(client, "demo-hold-3000 holder"))]
        await _wait_metric(one_slot, "modelyard_inflight", 1, cluster=CLUSTER)
        calls += [asyncio.ensure_future(_ask(client, f"queued {i}")) for i in range(2)]
        await _wait_metric(one_slot, "modelyard_queue_depth", 2, cluster=CLUSTER, tier="L3")
        assert _metric(one_slot, "modelyard_deployment_state", cluster=CLUSTER, state="queueing") == 1
        assert _metric(one_slot, "modelyard_deployment_state", cluster=CLUSTER, state="ready") == 0
        argv = ["--config", str(one_slot.config_path), "--model", "demo-gpt", "--tenant", "demo-l2", "--live", "--json"]
        assert await asyncio.to_thread(explain_main, argv) == 0
        await asyncio.gather(*calls)
        return orjson.loads(capsys.readouterr().out)

    doc = asyncio.run(run())
    _idle(one_slot)
    assert _metric(one_slot, "modelyard_deployment_state", cluster=CLUSTER, state="ready") == 1
    row = next(r for r in doc["rows"] if r["cluster"] == CLUSTER)
    assert row["queue"]["inflight"] == 1 and row["queue"]["waiting"] == {"L1": 0, "L2": 0, "L3": 2}
    assert doc["queue"] == "waits: 0 ahead of it in tiers up to L2"  # L2 goes before the two L3s


async def _flood(stack, key: str, callers: int, until: float, hold_ms: int) -> list[float]:
    """`callers` loops sending back to back until `until`; the queue wait of every answer before then."""
    client = _client(stack, key)
    waits: list[float] = []

    async def caller(i: int) -> None:
        n = 0
        while time.monotonic() < until:
            text, wait, _ = await _ask(client, f"demo-hold-{hold_ms} {key[-3:]} {i} {n}")
            assert text.endswith(f"{i} {n}")
            if time.monotonic() < until:
                waits.append(wait)
            n += 1

    await asyncio.gather(*(caller(i) for i in range(callers)))
    return waits


def test_two_tenants_flooding_equally_get_equal_shares(one_slot) -> None:
    _idle(one_slot)

    async def run() -> tuple[list[float], list[float]]:
        until = time.monotonic() + 8.0
        a, b = await asyncio.gather(_flood(one_slot, L3, 6, until, 40), _flood(one_slot, L3_OTHER, 6, until, 40))
        return a, b

    a, b = asyncio.run(run())
    assert len(a) >= 30 and len(b) >= 30, (len(a), len(b))
    assert abs(len(a) - len(b)) <= 0.1 * max(len(a), len(b)), (len(a), len(b))


def test_a_tenant_sending_10x_more_does_not_double_the_others_wait(one_slot) -> None:
    """B keeps 2 callers going throughout; A first sends as much as B, then 10x as much. Under FIFO
    B's wait would grow with A's backlog (about 10x); with fair shares B still gets half the slot."""
    _idle(one_slot)

    async def against(a_callers: int, seconds: float) -> list[float]:
        until = time.monotonic() + seconds
        _, light = await asyncio.gather(_flood(one_slot, L3, a_callers, until, 50),
                                        _flood(one_slot, L3_OTHER, 2, until, 50))
        return light

    equal = asyncio.run(against(2, 6.0))
    _idle(one_slot)
    flooded = asyncio.run(against(20, 8.0))
    p50_equal, p50_flooded = statistics.median(equal), statistics.median(flooded)
    assert len(equal) >= 10 and len(flooded) >= 10, (len(equal), len(flooded))
    assert p50_flooded <= 2 * p50_equal, (p50_equal, p50_flooded)


def test_failing_and_abandoned_slots_lose_and_duplicate_nothing(one_slot) -> None:
    _idle(one_slot)
    before = httpx.get(f"http://{one_slot.cfg.models[0].deployments[0].endpoints[0]}/stats").json()["requests"]

    async def run() -> tuple[list, float]:
        client = _client(one_slot, L3)
        impatient = _client(one_slot, L1, timeout=0.5)
        holder = asyncio.ensure_future(_ask(client, "demo-hold-2000 demo-fail-500 holder fails"))
        await _wait_metric(one_slot, "modelyard_inflight", 1, cluster=CLUSTER)
        texts = [f"demo-fail-500 queued {i}" if i % 3 == 0 else f"demo-hold-20 queued {i}" for i in range(12)]
        queued = [asyncio.ensure_future(_ask(client, t)) for t in texts]
        # An L1 caller that gives up while it waits first in line: its place must not be lost to the others.
        with pytest.raises(openai.APITimeoutError):
            await _ask(impatient, "demo-hold-20 gives up")
        results = await asyncio.gather(holder, *queued, return_exceptions=True)
        return list(zip(["holder fails", *texts], results)), time.monotonic()

    results, _ = asyncio.run(run())
    ok = [(t, r) for t, r in results if not isinstance(r, BaseException)]
    failed = [(t, r) for t, r in results if isinstance(r, BaseException)]
    assert all("demo-fail-500" in t or t == "holder fails" for t, _ in failed)
    assert all(isinstance(r, openai.InternalServerError) and r.status_code == 502 for _, r in failed)
    assert len(failed) == 5 and len(ok) == 8
    for text, (answer, _, _) in ok:
        assert answer.endswith(text)  # each caller got its own answer, once
    assert len({r[2] for _, r in ok}) == len(ok)
    _idle(one_slot)
    after = httpx.get(f"http://{one_slot.cfg.models[0].deployments[0].endpoints[0]}/stats").json()["requests"]
    # Every request reached the upstream once (Envoy retries a 5xx once, within the same slot), and
    # the caller that gave up either never reached it or did once.
    assert after - before - len(ok) - 2 * len(failed) in (0, 1)


def test_client_reset_frees_the_slot_at_once(one_slot) -> None:
    _idle(one_slot)

    async def run() -> float:
        quitter = _client(one_slot, L3, timeout=0.5)
        with pytest.raises(openai.APITimeoutError):
            await _ask(quitter, "demo-hold-8000 leaves early")
        started = time.monotonic()
        await _ask(_client(one_slot, L3), "next in line")
        return time.monotonic() - started

    assert asyncio.run(run()) < 4.0  # not the 8 s the abandoned request would have held
    _idle(one_slot)


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory):
    # 4 s: the first waiter must still be queued when the second joins it, a 429 later (a loaded box
    # took over 2 s between the two, and the first left at its 2 s bound before the queue held two).
    data = _queued_config(1, bound={"L1": 2, "L2": 2, "L3": 2}, max_wait_s={"L1": 4, "L2": 4, "L3": 4},
                          tenant_share=0.5)
    with start_stack(tmp_path_factory.mktemp("tight"), data) as stack:
        stack.metrics = f"http://{data['extproc']['metrics_address']}/metrics"
        yield stack


def test_refusals_in_the_callers_shape(tight) -> None:
    _idle(tight)

    async def run() -> tuple:
        holder = asyncio.ensure_future(_ask(_client(tight, L3), "demo-hold-8000 holder"))
        await _wait_metric(tight, "modelyard_inflight", 1, cluster=CLUSTER)
        first = asyncio.ensure_future(_ask(_client(tight, L3), "waits"))
        await _wait_metric(tight, "modelyard_queue_depth", 1, cluster=CLUSTER, tier="L3")
        ant = anthropic.AsyncAnthropic(base_url=tight.url, api_key=L3, max_retries=0)
        try:  # the same tenant again: past its share of the L3 queue (1 of 2)
            await ant.messages.create(model="demo-gpt", max_tokens=20, messages=[{"role": "user", "content": "more"}])
            own_share = None
        except anthropic.RateLimitError as e:
            own_share = e
        second = asyncio.ensure_future(_ask(_client(tight, L3_OTHER), "fills the queue"))
        await _wait_metric(tight, "modelyard_queue_depth", 2, cluster=CLUSTER, tier="L3")
        no_room = None
        try:  # the tier's queue is full: capacity, not anyone's share
            await _ask(_client(tight, L3), "no room")
        except openai.APIStatusError as e:
            no_room = e
        results = await asyncio.gather(first, second, return_exceptions=True)
        await holder
        return own_share, no_room, results

    own_share, no_room, results = asyncio.run(run())
    assert own_share is not None and own_share.status_code == 429
    assert own_share.response.json()["error"]["type"] == "rate_limit_error"  # Anthropic's error shape
    assert int(own_share.response.headers["retry-after"]) >= 1
    assert no_room is not None and no_room.status_code == 503 and int(no_room.response.headers["retry-after"]) >= 1
    # Both queued requests waited past the L3 max wait (4 s) behind an 8 s holder: 503 + retry-after.
    for r in results:
        assert isinstance(r, openai.APIStatusError) and r.status_code == 503, r
        assert int(r.response.headers["retry-after"]) >= 1
        assert "no free capacity within 4s" in r.response.json()["error"]["message"]
    assert _metric(tight, "modelyard_queue_refused_total", cluster=CLUSTER, reason="max_wait") >= 2
    assert _metric(tight, "modelyard_queue_refused_total", cluster=CLUSTER, reason="tenant_share") >= 1


def test_demo_queue_lets_a_burst_of_40_wait(tmp_path: Path) -> None:
    """demo-mini's limits from the shipped modelyard.yaml: 40 concurrent callers on 4 slots all wait, none refused."""
    shipped = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    mini = next(m for m in shipped["models"] if m["name"] == "demo-mini")["deployments"][0]
    assert mini["max_inflight"] == 4
    data = _queued_config(mini["max_inflight"], **mini["queue"])
    with start_stack(tmp_path, data) as stack:
        stack.metrics = f"http://{data['extproc']['metrics_address']}/metrics"

        async def run() -> list:
            client = _client(stack, L3)
            return await asyncio.gather(*(_ask(client, f"demo-hold-100 burst {i}") for i in range(40)))

        results = asyncio.run(run())
        assert Counter(r[0].rsplit(" ", 1)[1] for r in results) == Counter(str(i) for i in range(40))
        assert max(r[1] for r in results) > 0.2  # most of the burst waited for one of the four slots
        assert _metric(stack, "modelyard_queue_wait_seconds_count", cluster=CLUSTER) == 40


def test_idle_spot_is_preferred_and_a_vanished_one_failed_over(tmp_path: Path) -> None:
    """Under the cost strategy the idle spot deployment is tried first; when it is gone (nobody
    listens), Envoy fails over to the on-demand one inside the same request."""
    from tests.stack_config import free_port

    data = small_config()
    on_demand = data["models"][0]["deployments"][0]
    live_spot = {"cluster": "demo-spot", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"],
                 "spot": True, "max_inflight": 2}
    gone_spot = {"cluster": "gone-spot", "protocol": "openai", "endpoints": [f"127.0.0.1:{free_port()}"],
                 "spot": True}
    data["models"][0]["deployments"] = [on_demand, live_spot]
    data["models"].append({"name": "spotty", "deployments": [gone_spot, dict(on_demand, cluster="demo-ondemand",
                                                                             endpoints=[f"127.0.0.1:{free_port()}"])]})
    for t in data["tenants"]:
        t["allowed_models"] = ["*"]
        t["strategy"] = "cost"
    from contracts.config import parse_config
    from extproc.routing import RouteRequest, Scheduler

    cfg = parse_config(data)
    first = Scheduler(cfg).decide(RouteRequest("spotty", cfg.tenants[0]), 0.0, {})
    assert [c.cluster for c in first.candidates] == ["gone-spot", "demo-ondemand"]  # what the request starts with
    with start_stack(tmp_path, data) as stack:
        client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=L1, max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="demo-gpt", messages=[{"role": "user", "content": "cheap please"}])
        assert raw.headers["x-modelyard-cluster"] == "demo-spot"  # same price as on-demand: spot goes first
        assert raw.parse().choices[0].message.content == "[demo-spot] echo: cheap please"
        raw = client.chat.completions.with_raw_response.create(
            model="spotty", messages=[{"role": "user", "content": "still there?"}])
        assert raw.headers["x-modelyard-cluster"] == "demo-ondemand"  # who really answered
        assert raw.parse().choices[0].message.content == "[demo-ondemand] echo: still there?"


def test_streams_hold_their_slot_until_they_end(one_slot) -> None:
    """A stream keeps its slot to the last event (or its cut); the next caller goes after it."""
    _idle(one_slot)

    async def run() -> tuple[str, str, tuple]:
        client = _client(one_slot, L3)

        async def stream(text: str) -> str:
            chunks = await client.chat.completions.create(
                model="demo-gpt", stream=True, messages=[{"role": "user", "content": text}])
            return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

        whole = asyncio.ensure_future(stream("demo-hold-1500 streams whole"))
        await _wait_metric(one_slot, "modelyard_inflight", 1, cluster=CLUSTER)
        cut = asyncio.ensure_future(stream("demo-cut-stream is cut"))
        await _wait_metric(one_slot, "modelyard_queue_depth", 1, cluster=CLUSTER, tier="L3")
        after = asyncio.ensure_future(_ask(client, "after the streams"))
        await _wait_metric(one_slot, "modelyard_queue_depth", 2, cluster=CLUSTER, tier="L3")
        cut_text = await asyncio.gather(cut, return_exceptions=True)
        return await whole, str(cut_text[0]), await after

    whole, cut, after = asyncio.run(run())
    assert whole.endswith("echo: demo-hold-1500 streams whole")
    assert cut  # an error event or a partial text: either way the stream ended
    assert after[0].endswith("echo: after the streams") and after[1] > 0.3
    _idle(one_slot)  # every slot came back
