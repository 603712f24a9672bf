"""The async shell around the queues: waiting, waking, timing out, callers that leave."""

from __future__ import annotations

import asyncio

import pytest

from contracts.config import parse_config
from contracts.errors import ClientError, Unavailable
from extproc.admission.concurrency import ConcurrencyLimits
from tests.core.concurrency_config import KEY
from tests.core.concurrency_config import slot_config as _config


def _limits(max_inflight: int = 1, **queue: object) -> ConcurrencyLimits:
    return ConcurrencyLimits(_config(max_inflight, **queue))


async def test_unlimited_deployment_needs_no_slot() -> None:
    limits = _limits()
    assert "free" not in limits
    assert await limits.acquire("free", "m", "t", "L3") is None


async def test_waiter_wakes_when_the_slot_is_released() -> None:
    # The queue's own clock, moved by hand: on a loaded box the waiter's task may start well after
    # the test's sleep began, so a wall-clock bound on its wait said more about the box than the queue.
    now = [100.0]
    limits = ConcurrencyLimits(_config(1), clock=lambda: now[0])
    first = await limits.acquire("c", "m", "a", "L3")
    assert first is not None and first.waited_s == 0
    second = asyncio.ensure_future(limits.acquire("c", "m", "b", "L3"))
    await asyncio.sleep(0.05)
    assert not second.done() and limits.queues["c"].waiting() == 1
    now[0] += 0.25
    first.release()
    slot = await asyncio.wait_for(second, 10)
    assert slot is not None and slot.waited_s == pytest.approx(0.25)
    first.release()  # idempotent: does not free the second's slot
    assert limits.queues["c"].inflight == 1


async def test_max_wait_passed_is_503_with_retry_after() -> None:
    limits = _limits(1, max_wait_s={"L3": 0.1})
    await limits.acquire("c", "m", "a", "L3")
    with pytest.raises(Unavailable) as e:
        await limits.acquire("c", "m", "b", "L3")
    assert e.value.status == 503 and dict(e.value.headers)["retry-after"]
    assert limits.queues["c"].waiting() == 0


async def test_own_share_exceeded_is_429() -> None:
    limits = _limits(1, bound=2, tenant_share=0.5)
    await limits.acquire("c", "m", "a", "L3")
    waiting = asyncio.ensure_future(limits.acquire("c", "m", "b", "L3"))
    await asyncio.sleep(0)
    with pytest.raises(ClientError) as e:
        await limits.acquire("c", "m", "b", "L3")
    assert e.value.status == 429 and "retry-after" in dict(e.value.headers)
    waiting.cancel()


async def test_caller_that_leaves_is_taken_out_and_the_next_one_served() -> None:
    limits = _limits(1)
    holder = await limits.acquire("c", "m", "a", "L3")
    assert holder is not None
    leaving = asyncio.ensure_future(limits.acquire("c", "m", "b", "L3"))
    staying = asyncio.ensure_future(limits.acquire("c", "m", "c", "L3"))
    await asyncio.sleep(0.01)
    leaving.cancel()
    await asyncio.sleep(0)
    assert limits.queues["c"].waiting() == 1
    holder.release()
    assert (await asyncio.wait_for(staying, 1)) is not None


async def test_slot_granted_as_the_caller_leaves_is_passed_on() -> None:
    limits = _limits(1)
    holder = await limits.acquire("c", "m", "a", "L3")
    assert holder is not None
    leaving = asyncio.ensure_future(limits.acquire("c", "m", "b", "L3"))
    staying = asyncio.ensure_future(limits.acquire("c", "m", "c", "L3"))
    await asyncio.sleep(0.01)
    holder.release()  # grants `leaving`, whose task has not run yet ...
    leaving.cancel()  # ... and is cancelled before it does
    assert (await asyncio.wait_for(staying, 1)) is not None
    assert limits.queues["c"].inflight == 1


async def test_deployment_states_cover_every_deployment_and_cooldown() -> None:
    import time

    from extproc.admission.dispatch import Dispatcher
    from extproc.routing import Scheduler
    from extproc.telemetry.metrics import DEPLOYMENT_STATES

    cfg = _config(1)
    dispatcher = Dispatcher(Scheduler(cfg), limits=ConcurrencyLimits(cfg))
    assert dispatcher.deployment_states() == {"c": "ready", "free": "ready"}
    slot = await dispatcher.limits.acquire("c", "m", "a", "L3")
    assert dispatcher.deployment_states()["c"] == "busy"
    waiting = asyncio.ensure_future(dispatcher.limits.acquire("c", "m", "b", "L3"))
    await asyncio.sleep(0)
    assert dispatcher.deployment_states()["c"] == "queueing"
    for _ in range(3):  # the default cooldown: 3 failures in a minute
        dispatcher.scheduler.record("free", 0.1, False, now=time.monotonic())
    assert dispatcher.deployment_states()["free"] == "cooldown"
    DEPLOYMENT_STATES.source = dispatcher.deployment_states
    try:
        samples = {(s.labels["cluster"], s.labels["state"]): s.value for f in DEPLOYMENT_STATES.collect()
                   for s in f.samples}
    finally:
        DEPLOYMENT_STATES.source = None
    assert samples[("c", "queueing")] == 1 and samples[("c", "ready")] == 0 and samples[("free", "cooldown")] == 1
    assert slot is not None
    slot.release()
    await asyncio.wait_for(waiting, 1)


async def test_a_deployment_with_its_own_price_is_billed_at_it() -> None:
    from prometheus_client import REGISTRY

    from adapters.internal import Usage
    from extproc.accounting import Accountant
    from extproc.admission.choice import Choice
    from extproc.context import RequestContext
    from extproc.routing import Scheduler

    cfg = parse_config({"models": [{"name": "billed", "cost": {"input_per_1k": 10.0, "output_per_1k": 10.0},
                                    "deployments": [{"cluster": "spot", "protocol": "openai", "spot": True,
                                                     "endpoints": ["127.0.0.1:9"],
                                                     "cost": {"input_per_1k": 1.0, "output_per_1k": 2.0}}]}],
                        "tenants": [{"name": "payer", "api_keys": [KEY]}]})
    model = cfg.models[0]
    ctx = RequestContext("t", "POST", "/", {}, {}, tenant=cfg.tenants[0])
    labels = {"model": "billed", "tenant": "payer"}
    before = REGISTRY.get_sample_value("modelyard_cost_total", labels) or 0.0
    Accountant(Scheduler(cfg)).record_outcome(ctx, Choice(model=model, deployment=model.deployments[0]), status=200,
                                              upstream_ok=True, latency_s=0.1, ttft_s=None,
                                              usage=Usage(input_tokens=1000, output_tokens=1000))
    assert REGISTRY.get_sample_value("modelyard_cost_total", labels) - before == pytest.approx(3.0)


def test_queue_series_exist_before_any_request() -> None:
    from prometheus_client import REGISTRY

    cfg = _config(1)
    ConcurrencyLimits(cfg)
    for tier in ("L1", "L2", "L3"):
        assert REGISTRY.get_sample_value("modelyard_queue_depth", {"model": "m", "cluster": "c", "tier": tier}) == 0
        assert REGISTRY.get_sample_value("modelyard_queue_wait_seconds_count",
                                         {"model": "m", "cluster": "c", "tier": tier}) is not None
    assert REGISTRY.get_sample_value("modelyard_queue_depth", {"model": "m", "cluster": "free", "tier": "L1"}) is None


async def test_a_paused_deployment_holds_every_caller_until_it_resumes() -> None:
    # Scale from zero (extproc/admission/waking.py): no replica ready, so even a free slot is not granted.
    limits = _limits(2)
    held: list[str] = []
    limits.on_hold = held.append
    first = await limits.acquire("c", "m", "a", "L3")  # granted before the pause: a call already in flight
    limits.pause("c")
    waiters = [asyncio.ensure_future(limits.acquire("c", "m", "a", "L3")) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert held == ["c", "c"] and limits.queues["c"].waiting() == 2
    assert first is not None
    first.release()  # its slot does not go to a waiter while paused
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters) and limits.queues["c"].inflight == 0
    limits.resume("c")
    slots = await asyncio.wait_for(asyncio.gather(*waiters), 10)
    assert all(s is not None for s in slots) and limits.queues["c"].inflight == 2
